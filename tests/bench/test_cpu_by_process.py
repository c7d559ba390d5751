"""bench/cpu_by_process.py: a command's CPU time, by the kind of process that spent it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "cpu_by_process.py"

needs_proc = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux's /proc")


def _load_bench() -> ModuleType:
    return load_bench_script("cpu_by_process.py", "cpu_by_process_bench")


IDLE = "Ray workers while idle (starting up, or between tasks)"
RAY = "Ray's own processes (raylet, GCS, monitors, `ray start`)"
OTHER = "other: python"

# (id, name, command line, kind): as a fresh clone's `make test` showed them (paths
# shortened; a Ray worker's name is its title's first 15 characters), then lines that
# name a tool or a folder only in an argument.
SEEN = [
    (
        "xdist",
        "python",
        "/c/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))",
        "pytest workers (xdist)",
    ),
    ("trial", "ray::ImplicitFu", "ray::ImplicitFunc.train", "trial actors (ray::ImplicitFunc)"),
    ("profile", "ray::IDLE", "ray::hpo-profile:tft/bf16@GPU", "profile tasks (ray::hpo-profile)"),
    ("agent", "ray::DashboardA", "ray::DashboardAgent", "Ray's dashboard and runtime-env agents"),
    ("idle", "ray::IDLE", "ray::IDLE", IDLE),
    (
        "prestart",
        "python",
        "/c/.venv/bin/python /c/.venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1",
        IDLE,
    ),
    ("board", "ray::AshaRungs", "ray::AshaRungs", "other Ray tasks and actors"),
    (
        "raylet",
        "raylet",
        "/c/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x",
        RAY,
    ),
    (
        "log-monitor",
        "python",
        "/c/.venv/bin/python -u /c/.venv/lib/python3.11/site-packages/ray/_private/log_monitor.py --session-dir=/tmp/ray/s",
        RAY,
    ),
    (
        "dashboard-module",
        "ray-dashboard-N",
        "ray-dashboard-NodeHead-0 (/c/.venv/bin/python -B -c from multiprocessing.forkserver"
        " import main; main(25, 27, ['ray', 'ray.dashboard.subprocesses'])",
        RAY,
    ),
    (
        "uvicorn",
        "python",
        "/c/.venv/bin/python -m uvicorn --host 127.0.0.1 --port 55 mlflow.server.fastapi_app:app",
        "MLflow tracking servers",
    ),
    (
        "mlflow",
        "python",
        "/c/.venv/bin/python -m mlflow server --backend-store-uri sqlite:////tmp/pytest-of-root/m.db",
        "MLflow tracking servers",
    ),
    (
        "hpo-m",
        "python",
        "/c/.venv/bin/python -m hpo.cli sweep /tmp/pytest-of-root/pytest-15/popen-gw0/t0/seq.yaml",
        "`hpo` commands",
    ),
    (
        "hpo-bin",
        "hpo",
        "/c/.venv/bin/python /c/.venv/bin/hpo resume /tmp/x/results/seq",
        "`hpo` commands",
    ),
    (
        "pytest",
        "python",
        ".venv/bin/python -m pytest -q -n 2 --dist loadgroup",
        "pytest (controller, child sessions)",
    ),
    ("bench", "python", "/c/.venv/bin/python /c/bench/pbt_search.py --smoke", "bench scripts"),
    ("bench-make", "python", ".venv/bin/python bench/machine.py", "bench scripts"),
    (
        "compileall",
        "python",
        ".venv/bin/python -m compileall -q -j 0 -x /(mypy|pip)/ .venv/lib",
        "bytecode (compileall)",
    ),
    ("mypy", "mypy", "/c/.venv/bin/python /c/.venv/bin/mypy hpo trainables", "mypy"),
    ("pip", "python", ".venv/bin/python -m pip install -q --no-deps -r .venv/lock-odd.txt", "pip"),
    ("chromium", "chromium", "/usr/lib/chromium/chromium --headless", "chromium"),
    (
        "arg-mypy",
        "python",
        "/c/.venv/bin/python -c pass /tmp/pytest-of-root/test_mypy_ruff_pip0",
        OTHER,
    ),
    ("arg-bench", "python", "/c/.venv/bin/python -c pass /tmp/bench/x.py", OTHER),
    ("exited", "python", "", OTHER),
]


@pytest.mark.parametrize(
    ("comm", "cmdline", "kind"), [s[1:] for s in SEEN], ids=[s[0] for s in SEEN]
)
def test_each_process_of_a_test_run_counts_under_its_kind(
    comm: str, cmdline: str, kind: str
) -> None:
    assert _load_bench().kind_of(comm, cmdline) == kind


def test_a_kernel_thread_counts_by_its_name_without_the_cpu_number() -> None:
    bench = _load_bench()
    assert bench.kind_of("kdamond.0", "", kernel=True) == "kernel thread kdamond.0"
    assert bench.kind_of("kworker/1:1H-kblockd", "", kernel=True) == "kernel thread kworker"


def test_a_kind_given_on_the_command_line_comes_before_the_rules() -> None:
    bench = _load_bench()
    extra = [("mine", "Implicit")]
    assert bench.kind_of("ray::ImplicitFu", "ray::ImplicitFunc.train", extra=extra) == "mine"
    assert bench.parse_kind("grpc=grpc_fork") == ("grpc", "grpc_fork")


@pytest.mark.parametrize("text", ["grpc", "=grpc", "grpc="])
def test_a_kind_without_a_label_or_a_substring_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL=SUBSTRING"):
        _load_bench().parse_kind(text)


def test_a_command_line_is_read_again_only_where_it_can_have_changed() -> None:
    bench = _load_bench()
    trial = bench.Seen(7, "ray::ImplicitFu", "ray::ImplicitFunc.train", False, 1.0, sightings=4)
    assert not bench.may_rename(trial, "ray::ImplicitFu")
    assert bench.may_rename(trial, "ray::IDLE")  # renamed itself
    idle = bench.Seen(8, "ray::IDLE", "ray::IDLE", False, 1.0, sightings=40)
    assert bench.may_rename(idle, "ray::IDLE")  # may take a trial any time
    child = bench.Seen(9, "python", ".venv/bin/python -m pytest", False, 0.0, sightings=2)
    assert bench.may_rename(child, "python")  # forked: may not have exec'd yet


def test_each_interval_counts_under_the_kind_the_process_had_when_it_ended() -> None:
    bench = _load_bench()
    worker = bench.Seen(7, "ray::IDLE", "ray::IDLE", False, 0.0)
    worker.charge(1.5, ())  # started and imported Ray, idle
    worker.cmdline, worker.comm = "ray::ImplicitFunc.train", "ray::ImplicitFu"
    worker.charge(6.0, ())
    worker.charge(6.0, ())  # nothing since: nothing counted
    assert worker.by_kind == {IDLE: 1.5, "trial actors (ray::ImplicitFunc)": 4.5}


def _write_process(proc: Path, pid: int, comm: str, cmdline: str, cpu_s: float, start: int) -> None:
    """A ``/proc/<pid>`` of a user process: its stat (fields after the name: flags 6,
    utime 11, stime 12, start time 19; 100 ticks a second) and its command line."""
    fields = ["S", "1", "1", "1", "0", "-1", "4194560", *["0"] * 4, str(round(cpu_s * 100))]
    fields += ["0"] * 7 + [str(start), "0"]
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (proc / str(pid) / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def test_the_sampler_counts_each_interval_under_the_title_a_process_has_at_its_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _load_bench()
    monkeypatch.setattr(bench, "PROC", tmp_path)
    monkeypatch.setattr(bench, "TICKS_PER_S", 100)
    (tmp_path / "self").mkdir()  # not a process
    _write_process(tmp_path, 100, "python", "python -m pytest -q", 50.0, start=10)
    sampler = bench.Sampler()
    sampler.sample()  # pytest was running already: it counts from here
    _write_process(tmp_path, 100, "python", "python -m pytest -q", 51.0, start=10)
    _write_process(tmp_path, 200, "ray::IDLE", "ray::IDLE", 1.0, start=20)
    sampler.sample()
    for _ in range(4):  # past its first samples: still re-read while idle
        sampler.sample()
    _write_process(tmp_path, 200, "ray::ImplicitFu", "ray::ImplicitFunc.train", 4.0, start=20)
    sampler.sample()
    (tmp_path / "200" / "stat").unlink()  # it ended; its pid comes back as another process
    _write_process(tmp_path, 200, "ray::IDLE", "ray::IDLE", 0.5, start=30)
    sampler.sample()
    rows = {r.kind: (r.cpu_s, r.processes) for r in bench.totals(list(sampler.seen.values()))}
    assert rows == {
        "pytest (controller, child sessions)": (1.0, 1),
        IDLE: (1.5, 2),
        "trial actors (ray::ImplicitFunc)": (3.0, 1),
    }


def test_processes_are_summed_per_kind() -> None:
    bench = _load_bench()
    trial = "trial actors (ray::ImplicitFunc)"
    seen = [
        bench.Seen(1, "x", "", False, 0.0, by_kind={trial: 6.0, IDLE: 0.5}),
        bench.Seen(2, "x", "", False, 0.0, by_kind={trial: 4.5}),
        bench.Seen(3, "kdamond.0", "", True, 0.0, by_kind={"kernel thread kdamond.0": 10.0}),
        bench.Seen(4, "x", "", False, 0.0),  # used nothing while sampled
    ]
    rows = bench.totals(seen)
    assert [(r.kind, r.cpu_s, r.processes) for r in rows] == [
        (trial, 10.5, 2),
        ("kernel thread kdamond.0", 10.0, 1),
        (IDLE, 0.5, 1),
    ]
    table = bench.format_table(rows, min_cpu_s=10.25)
    assert table[0].split() == list(bench.HEADER)
    assert table[1].split() == ["10.5", "50.0%", "2", "trial", "actors", "(ray::ImplicitFunc)"]
    assert table[2].split()[:3] == ["10.5", "50.0%", "2"]
    assert table[2].endswith("2 kinds under 10.25 CPU-s")


def test_a_signal_that_ended_the_command_is_its_status_as_a_shell_gives_it() -> None:
    bench = _load_bench()
    assert (bench.exit_status(0), bench.exit_status(3), bench.exit_status(-15)) == (0, 3, 143)


# A child that spends 1.0 CPU-s of its own (its process time, not the clock's: the same on
# a loaded machine), then waits long enough for the sampler to see it.
BURN = """
import time
while time.process_time() < 1.0:
    sum(i * i for i in range(10_000))
time.sleep(2.0)
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120
    )


@needs_proc
def test_the_script_runs_the_command_and_counts_a_childs_cpu_under_its_kind(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    marker = f"cpu-burner-{uuid.uuid4().hex}"  # another run's burner on the machine is not ours
    options = ["--every", "0.1", "--min", "0", "--json", str(out), "--kind", f"burner={marker}"]
    done = _run(*options, "--", sys.executable, "-c", BURN, marker)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if tuple(line.split()) == _load_bench().HEADER)
    rows = {line.split(None, 3)[3]: line.split() for line in lines[header + 1 :]}
    assert 0.9 <= float(rows["burner"][0]) <= 1.3, done.stdout
    assert rows["burner"][2] == "1"
    (burner,) = [p for p in json.loads(out.read_text()) if marker in p["cmdline"]]
    assert 0.9 <= burner["cpu_s"]["burner"] <= 1.3


@needs_proc
@pytest.mark.parametrize(
    ("command", "status"),
    [
        (["-c", "raise SystemExit(3)"], 3),
        (["-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], 143),
    ],
    ids=["exit-3", "sigterm"],
)
def test_the_script_exits_with_the_commands_status(command: list[str], status: int) -> None:
    done = _run("--", sys.executable, *command)
    assert done.returncode == status
    assert f": exit {status} in " in done.stdout


@needs_proc
def test_a_command_that_cannot_run_is_named_with_a_shells_status() -> None:
    done = _run("--", "/nonexistent/no-such-command")
    assert done.returncode == 127
    assert "cannot run '/nonexistent/no-such-command'" in done.stderr


def test_a_sampling_interval_that_is_not_above_zero_is_refused_before_anything_runs() -> None:
    done = _run("--every", "0", "--", sys.executable, "-c", "print('ran')")
    assert done.returncode == 2
    assert "--every wants seconds above 0, got '0'" in done.stderr
    assert "ran" not in done.stdout
