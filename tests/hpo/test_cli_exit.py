"""How the ``hpo`` program ends: with its command's exit status, its output flushed and
every exit handler run, but without the interpreter's teardown (hpo.cli._app.main)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.local_cluster import MARK, marked_pids
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
    mark = f"exit-test-{tmp_path.name}"
    script = """
import sys
import ray
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
from hpo.cli import _app
_app.exit_on_user_error = lambda app: sys.exit(0)
_app.main()
"""
    env = {**os.environ, MARK: mark}  # inherited by every Ray process it starts
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    wait_for(
        lambda: not marked_pids(mark),
        timeout=60,
        what="the Ray processes the program started to end",
        detail=lambda: str(marked_pids(mark)),
    )
