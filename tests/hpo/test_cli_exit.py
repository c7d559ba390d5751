"""How the ``hpo`` program ends: with its command's exit status, its output flushed and
every exit handler run, but without the interpreter's teardown (hpo.cli._app.main)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpo.cli import _app
from tests.hpo.sweep_helpers import write_tiny_spec
from tests.processes import wait_for

# A command stand-in that registers an exit handler, as Ray and MLflow do once imported,
# prints without flushing, and exits with the status it is given.
SCRIPT = """
import atexit, sys
from hpo.cli import _app
out, code = sys.argv[1], sys.argv[2]

def command(app):
    atexit.register(lambda: open(out, "w").write("handler ran"))
    print("unflushed output", end="")
    sys.exit(int(code) if code.isdigit() else code)

_app.exit_on_user_error = command
_app.main()
"""


@pytest.mark.parametrize(("code", "status"), [("0", 0), ("3", 3), ("a message", 1)])
def test_the_program_exits_with_its_status_after_every_handler(
    tmp_path: Path, code: str, status: int
) -> None:
    out = tmp_path / "handler.txt"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), code], capture_output=True, text=True
    )
    assert done.returncode == status, done.stderr
    assert done.stdout == "unflushed output"  # flushed before the process ended
    assert out.read_text() == "handler ran"
    if status == 1:
        assert "a message" in done.stderr  # Python's own report of sys.exit("...")


def test_a_real_command_prints_all_its_output() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "families", "kan", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert [family["name"] for family in json.loads(done.stdout)] == ["kan"]


def test_an_uncaught_error_still_gets_pythons_traceback_and_status(tmp_path: Path) -> None:
    script = SCRIPT.replace(
        "sys.exit(int(code) if code.isdigit() else code)", "raise KeyError(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "h.txt"), "boom"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "KeyError: 'boom'" in done.stderr
    assert (tmp_path / "h.txt").read_text() == "handler ran"


def test_a_local_ray_started_before_main_is_stopped(tmp_path: Path) -> None:
    """Exit handlers registered before main() run after its own: Ray's shutdown, for a
    caller that imported ray first, is done by main's exit, leaving no Ray process."""
    script = """
import sys
import ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
from hpo.cli import _app
_app.exit_on_user_error = lambda app: sys.exit(0)
_app.main()
"""
    done, session = _run_in_new_session([sys.executable, "-c", script])
    assert done.returncode == 0, done.stderr
    _wait_until_none_left(session)


def _run_in_new_session(args: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``args`` as the leader of a new session, and return what it did and the
    session's id. Every process a local Ray starts stays in its driver's session, the
    raylet's agents included (they keep no marker in their environment: Ray renames its
    processes, which overwrites it)."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), proc.pid


def _still_running(session: int) -> list[str]:
    """The processes of ``session`` that still run ("pid name"); a zombie has ended."""
    running = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # ended meanwhile
            continue
        if not stat:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        state, _ppid, _pgrp, sid = fields.split()[:4]
        if int(sid) == session and state != "Z":
            running.append(f"{entry.name} {name}")
    return running


def _wait_until_none_left(session: int) -> None:
    wait_for(
        lambda: not _still_running(session),
        timeout=15,
        what="the Ray processes the program started to end",
        detail=lambda: str(_still_running(session)),
    )


# A command that starts a local Ray, as `hpo sweep` does (ray imported inside the command,
# after main's exit handler), with a worker busy in an actor and an exit handler of its
# own registered before ray was imported (so it runs after Ray's, and before main's).
RAY_COMMAND = """
import atexit, sys
from hpo.cli import _app
out = sys.argv[1]

def command(app):
    atexit.register(lambda: open(out, "w").write(f"ray up at exit: {ray.is_initialized()}"))
    import ray
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Actor:
        def ready(self):
            return True

    actor = Actor.remote()
    assert ray.get(actor.ready.remote())
    print("unflushed output", end="")
    sys.exit(0)

_app.exit_on_user_error = command
_app.main()
"""


@pytest.mark.ray
def test_a_local_ray_started_by_a_command_is_stopped_last_leaving_no_process(
    tmp_path: Path,
) -> None:
    """Ray's own exit handler (half a second asleep, then its processes stopped one at a
    time) does not run: every other handler sees Ray up, then main's exit stops the
    raylet (which stops its workers and agents) and kills the rest. Nothing of that Ray
    outlives the program; a raylet killed instead would leave its agents for a minute."""
    out = tmp_path / "handler.txt"
    done, session = _run_in_new_session([sys.executable, "-c", RAY_COMMAND, str(out)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "unflushed output"
    assert out.read_text() == "ray up at exit: True"
    _wait_until_none_left(session)


class _Process:
    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.calls: list[str] = []

    def poll(self) -> int | None:
        return None if self.alive else 0

    def terminate(self) -> None:
        self.calls.append("terminate")
        self.alive = False

    def wait(self, timeout: float) -> int:
        self.calls.append("wait")
        return 0

    def kill(self) -> None:
        self.calls.append("kill")
        self.alive = False


def _fake_ray(all_processes: dict[str, list[_Process]] | None) -> tuple[Any, list[str]]:
    """A ray module whose worker has a node with ``all_processes`` (None: no node)."""
    calls: list[str] = []
    node = None
    if all_processes is not None:
        node = SimpleNamespace(
            all_processes={
                k: [SimpleNamespace(process=p) for p in v] for k, v in all_processes.items()
            }
        )
    worker = SimpleNamespace(_global_node=node)

    def shutdown() -> None:
        calls.append("shutdown" if worker._global_node is node else "shutdown, node detached")

    ray = SimpleNamespace(_private=SimpleNamespace(worker=worker), shutdown=shutdown)
    return ray, calls


@pytest.mark.parametrize("all_processes", [None, {}])
def test_joined_to_a_cluster_ray_is_only_disconnected(
    all_processes: dict[str, list[_Process]] | None,
) -> None:
    ray, calls = _fake_ray(all_processes)  # address=...: a node that started no process
    _app._stop_ray(ray)
    assert calls == ["shutdown"]


def test_a_local_ray_is_stopped_by_its_raylet_then_the_rest_killed() -> None:
    raylet, gcs, monitor, gone = _Process(), _Process(), _Process(), _Process(alive=False)
    ray, calls = _fake_ray(
        {"raylet": [raylet], "gcs_server": [gcs], "monitor": [monitor], "dashboard": [gone]}
    )
    _app._stop_ray(ray)
    assert calls == ["shutdown, node detached"]  # the driver disconnected, nothing stopped
    assert raylet.calls == ["terminate", "wait"]
    assert gcs.calls == monitor.calls == ["kill"]
    assert gone.calls == []


# `hpo sweep` with the sweep itself replaced: what the collector is when the CLI hands over.
SWEEP_HANDS_OVER = """
import gc, sys
import hpo.sweep
from hpo.cli import main

def run_sweep(spec, **kwargs):
    print(gc.isenabled())
    sys.exit(0)

hpo.sweep.run_sweep = run_sweep
sys.argv = ["hpo", "sweep", sys.argv[1]]
main()
"""


def test_a_sweep_command_imports_with_the_collector_paused(tmp_path: Path) -> None:
    """Its imports (MLflow, Ray Tune) run without the cyclic collector walking the growing
    heap (trainables.memory.pause_collection); hpo.sweep resumes it before Tune's objects
    exist (tests/hpo/test_sweep_collection.py)."""
    spec = write_tiny_spec(tmp_path, "paused")
    done = subprocess.run(
        [sys.executable, "-c", SWEEP_HANDS_OVER, str(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
