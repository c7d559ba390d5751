"""The ``hpo`` Typer app: every command, registered in the order ``hpo --help`` lists
them, and :func:`main`, what the console script runs."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import typer

from hpo.cli._cluster import jobs_cmd, submit_cmd, tracking_server_cmd
from hpo.cli._comparison import compare_cmd, ensemble_cmd
from hpo.cli._local import check_family_cmd, families_cmd, predict_cmd, profile_cmd, train_cmd
from hpo.cli._options import exit_on_user_error
from hpo.cli._sweeps import best_cmd, resume_cmd, status_cmd, sweep_cmd

app = typer.Typer(
    name="hpo",
    help="foxhunt-hpo: hyperparameter sweeps of trading models in f32 and bf16.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
COMMANDS: dict[str, Callable[..., None]] = {
    "families": families_cmd,
    "train": train_cmd,
    "predict": predict_cmd,
    "sweep": sweep_cmd,
    "resume": resume_cmd,
    "status": status_cmd,
    "best": best_cmd,
    "ensemble": ensemble_cmd,
    "compare": compare_cmd,
    "check-family": check_family_cmd,
    "profile": profile_cmd,
    "submit": submit_cmd,
    "jobs": jobs_cmd,
    "tracking-server": tracking_server_cmd,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(_command)


def run() -> None:
    """Run the command line in ``sys.argv`` in this process (it exits as Typer does)."""
    # MLflow draws a progress bar per artifact it downloads (hpo compare: one per trial
    # on a remote store) into hpo's own output; an explicit value is kept.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    exit_on_user_error(app)


def main() -> None:
    """The ``hpo`` program (its console script, ``python -m hpo.cli``): :func:`run`, then
    an exit that skips the interpreter's teardown.

    Once every exit handler has run (Ray's shutdown, MLflow's, logging's flush), what is
    left of a normal exit is the interpreter freeing torch's, Ray's and MLflow's modules
    one object at a time: one to two seconds of every command, of no use to anyone. The
    handler registered here, first, runs last and ends the process with the command's
    exit status; it stops the Ray this process started (:func:`_stop_ray`), in place of
    Ray's own exit handler. An interrupt (Ctrl+C) exits the usual way."""
    status: list[int] = []
    atexit.register(_exit_now, status)
    try:
        run()
    except SystemExit as exc:
        status.append(_status_of(exc.code))
        _leave_ray_to_exit_now()
        raise
    except BaseException:  # a traceback, or an interrupt: Python's own exit, as ever
        status.append(-1)
        raise
    status.append(0)
    _leave_ray_to_exit_now()


def _status_of(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``: 0 for None, the int, else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _leave_ray_to_exit_now() -> None:
    """Ray registers ``ray.shutdown`` as an exit handler when it is imported: by a command,
    after main's handler, so it would run first, sleep half a second (for its workers'
    log lines, which hpo does not forward) and stop Ray the slow way. _exit_now stops Ray
    instead, after every other handler."""
    ray = sys.modules.get("ray")
    if ray is not None:
        atexit.unregister(ray.shutdown)


def _exit_now(status: list[int]) -> None:
    if not status or status[-1] < 0:
        return
    # Handlers registered before main() ran would run after this one: do their work here.
    # Ray's stops the local Ray's processes (a caller may have imported ray first).
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        _stop_ray(ray)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status[-1])


RAYLET_STOP_S = 10.0  # a raylet stops its workers and agents in well under a second


def _stop_ray(ray: ModuleType) -> None:
    """``ray.shutdown()``, quicker for a local Ray this process started (the program ends
    right after).

    ``ray.shutdown()`` stops a local Ray's processes one at a time: a SIGTERM, then up to a
    second's wait for each, 1.1-1.4 s in all with the CPUs idle. Only the raylet needs its
    SIGTERM and the wait: it stops its workers and its agents, which, were it killed,
    would outlive it (for a minute or more, reporting its death to a GCS that is gone).
    The others (the GCS, which keeps a local Ray's state in memory, the dashboard and the
    monitors) have nothing to save: they are killed, as the kernel would kill them when
    this process ends (Ray starts them with a parent-death signal). Joined to a cluster
    (``--address``), this process started nothing: ``ray.shutdown()`` disconnects."""
    worker = ray._private.worker
    node: Any = getattr(worker, "_global_node", None)
    raylets = [] if node is None else node.all_processes.get("raylet", [])
    if len(raylets) != 1:  # not a local Ray of this process's: Ray's own shutdown
        ray.shutdown()
        return
    worker._global_node = None  # ray.shutdown() now disconnects this driver, nothing more
    ray.shutdown()
    raylet = raylets[0].process
    raylet.terminate()
    try:
        raylet.wait(timeout=RAYLET_STOP_S)
    except subprocess.TimeoutExpired:  # Ray's own way: a SIGTERM and a wait each
        node.kill_all_processes(check_alive=False, allow_graceful=True)
        return
    for infos in node.all_processes.values():
        for info in infos:
            if info.process.poll() is None:
                info.process.kill()
