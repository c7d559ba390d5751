"""The ``hpo`` Typer app: every command, registered in the order ``hpo --help`` lists
them, and :func:`main`, what the console script runs."""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Callable

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
    exit status. An interrupt (Ctrl+C) exits the usual way."""
    status: list[int] = []
    atexit.register(_exit_now, status)
    try:
        run()
    except SystemExit as exc:
        status.append(_status_of(exc.code))
        raise
    except BaseException:  # a traceback, or an interrupt: Python's own exit, as ever
        status.append(-1)
        raise
    status.append(0)


def _status_of(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``: 0 for None, the int, else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _exit_now(status: list[int]) -> None:
    if not status or status[-1] < 0:
        return
    # Handlers registered before main() ran would run after this one: do their work here.
    # Ray's stops the local Ray's processes (a caller may have imported ray first).
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status[-1])
