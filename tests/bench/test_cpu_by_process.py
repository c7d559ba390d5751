"""bench/cpu_by_process.py: a command's CPU time, by the kind of process that spent it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "cpu_by_process.py"

pytestmark = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux's /proc")


def _load_bench() -> ModuleType:
    return load_bench_script("cpu_by_process.py", "cpu_by_process_bench")


# Command lines as a fresh clone's `make test` showed them (paths shortened).
SEEN = [
    (
        "python",
        "/c/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))",
        "pytest workers (xdist)",
    ),
    ("python", "ray::ImplicitFunc.train", "trial actors (ray::ImplicitFunc)"),
    ("python", "ray::hpo-profile:tft/bf16@GPU", "profile tasks (ray::hpo-profile)"),
    ("python", "ray::DashboardAgent", "Ray's dashboard and runtime-env agents"),
    ("python", "ray::IDLE", "idle Ray workers"),
    (
        "python",
        "/c/.venv/bin/python /c/.venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1",
        "idle Ray workers",
    ),
    (
        "raylet",
        "/c/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x",
        "Ray's own processes (raylet, GCS, monitors, `ray start`)",
    ),
    (
        "python",
        "/c/.venv/bin/python -u /c/.venv/lib/python3.11/site-packages/ray/_private/log_monitor.py --session-dir=/tmp/ray/s",
        "Ray's own processes (raylet, GCS, monitors, `ray start`)",
    ),
    (
        "python",
        "/c/.venv/bin/python -m uvicorn --host 127.0.0.1 --port 55 mlflow.server.fastapi_app:app",
        "MLflow tracking servers",
    ),
    (
        "python",
        "/c/.venv/bin/python -m hpo.cli sweep /tmp/pytest-of-root/pytest-15/popen-gw0/t0/seq.yaml",
        "`hpo` commands",
    ),
    (
        "python",
        "/c/.venv/bin/python -m mlflow server --backend-store-uri sqlite:////tmp/pytest-of-root/m.db",
        "MLflow tracking servers",
    ),
    (
        "python",
        ".venv/bin/python -m pytest -q -n 2 --dist loadgroup",
        "pytest (controller, child sessions)",
    ),
    ("python", "/c/.venv/bin/python /c/bench/pbt_search.py --smoke", "bench scripts"),
    ("python", ".venv/bin/python -m compileall -q -j 0 hpo", "bytecode (compileall)"),
    ("python", ".venv/bin/python -m pip install -q --no-deps -r .venv/lock-odd.txt", "pip"),
    ("chromium", "/usr/lib/chromium/chromium --headless", "chromium"),
    ("kdamond.0", "", "kernel thread kdamond.0"),
    ("kworker/1:1H-kblockd", "", "kernel thread kworker"),
    (
        "python",
        "/c/.venv/bin/python -c import sys; print(sys.argv) /tmp/pytest-of-root/x",
        "other: python",
    ),
]


@pytest.mark.parametrize(("comm", "cmdline", "kind"), SEEN, ids=[k for _, _, k in SEEN])
def test_each_process_of_a_test_run_counts_under_its_kind(
    comm: str, cmdline: str, kind: str
) -> None:
    assert _load_bench().kind_of(comm, cmdline) == kind


def test_a_kind_given_on_the_command_line_comes_before_the_rules() -> None:
    bench = _load_bench()
    assert bench.kind_of("python", "ray::ImplicitFunc.train", [("mine", "Implicit")]) == "mine"
    assert bench.parse_kind("grpc=grpc_fork") == ("grpc", "grpc_fork")
    with pytest.raises(Exception, match="LABEL=SUBSTRING"):
        bench.parse_kind("grpc")


def test_a_ray_worker_keeps_the_title_of_what_it_ran_once_it_is_idle_again() -> None:
    bench = _load_bench()
    assert bench.better_title("ray::ImplicitFunc.train", "ray::IDLE") == "ray::ImplicitFunc.train"
    assert bench.better_title("ray::ImplicitFunc.train", "") == "ray::ImplicitFunc.train"
    assert bench.better_title("ray::IDLE", "ray::ImplicitFunc.train") == "ray::ImplicitFunc.train"
    assert bench.better_title("python worker.py", "ray::IDLE") == "ray::IDLE"


def test_a_command_line_is_read_again_only_where_it_can_have_changed() -> None:
    bench = _load_bench()
    trial = bench.Seen(7, "python", "ray::ImplicitFunc.train", 0.0, 1.0, sightings=4)
    assert not bench.may_rename(trial, "python")
    assert bench.may_rename(trial, "ray::IDLE")  # renamed itself
    idle = bench.Seen(8, "python", "ray::IDLE", 0.0, 1.0, sightings=40)
    assert bench.may_rename(idle, "python")  # may take a trial any time
    child = bench.Seen(9, "python", "python -m pytest", 0.0, 0.0, sightings=2)
    assert bench.may_rename(child, "python")  # forked, may not have exec'd yet


def test_processes_are_summed_per_kind_from_what_they_used_since_sampling_began() -> None:
    bench = _load_bench()
    seen = [
        bench.Seen(1, "python", "ray::ImplicitFunc.train", 0.0, 6.0),
        bench.Seen(2, "python", "ray::ImplicitFunc.train", 0.0, 4.5),
        bench.Seen(3, "kdamond.0", "", 200.0, 210.0),  # running before: 10 CPU-s since
        bench.Seen(4, "python", "ray::IDLE", 3.0, 3.0),  # nothing since: left out
    ]
    rows = bench.totals(seen)
    assert [(r.kind, r.cpu_s, r.processes) for r in rows] == [
        ("trial actors (ray::ImplicitFunc)", 10.5, 2),
        ("kernel thread kdamond.0", 10.0, 1),
    ]
    table = bench.format_table(rows, min_cpu_s=10.25)
    assert table[1].split() == ["10.5", "51.2%", "2", "trial", "actors", "(ray::ImplicitFunc)"]
    assert table[2].split()[:3] == ["10.0", "48.8%", "1"]
    assert table[2].endswith("1 kinds under 10.25 CPU-s")


TABLE_HEADER = ["CPU-s", "share", "processes", "kind"]

# A child that spends 1.0 CPU-s of its own (its process time, not the clock's: the same on
# a loaded machine), then waits for the sampler to see it.
BURN = """
import time
while time.process_time() < 1.0:
    sum(i * i for i in range(10_000))
time.sleep(1.0)
"""


def test_the_script_runs_the_command_and_counts_a_childs_cpu_under_its_kind(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    command = [sys.executable, "-c", BURN, "cpu-burner-marker"]
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--every",
            "0.1",
            "--min",
            "0",
            "--json",
            str(out),
            "--kind",
            "burner=cpu-burner-marker",
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == TABLE_HEADER)
    rows = {line.split(None, 3)[3]: line.split() for line in lines[header + 1 :]}
    assert 0.9 <= float(rows["burner"][0]) <= 1.3, done.stdout
    assert rows["burner"][2] == "1"
    (burner,) = [p for p in json.loads(out.read_text()) if "cpu-burner-marker" in p["cmdline"]]
    assert 0.9 <= burner["cpu_s"] <= 1.3


def test_the_script_exits_with_the_commands_status() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert ": exit 3 in " in done.stdout
