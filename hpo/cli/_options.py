"""What the ``hpo`` commands share: consoles, option and argument types, tables, the
error-and-exit path and the spec a sweep command loads (every module of :mod:`hpo.cli`).

typer and rich only: ``hpo --help`` imports this module, so it stays instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from hpo.spec import SweepSpec

# Wide enough for the result tables when output goes to a log or a pipe (rich would use 80).
_WIDTH = None if sys.stdout.isatty() else 160
# No emoji codes: a family's import reference ("desk_gru:FAMILY") would print as a picture.
console = Console(width=_WIDTH, emoji=False)
err_console = Console(stderr=True, width=_WIDTH, emoji=False)

# Options several commands share, defined once.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
RayAddress = Annotated[
    str | None, typer.Option(help="Ray cluster address (default: start a local Ray).")
]
JobsAddress = Annotated[
    str | None,
    typer.Option(
        help="Ray Jobs API of the head (default: $RAY_API_SERVER_ADDRESS or http://127.0.0.1:8265)."
    ),
]
Assignments = Annotated[
    list[str] | None, typer.Option("--set", help="Override a setting: key=value (repeatable).")
]
SpecArg = Annotated[Path, typer.Argument(metavar="SPEC", help="Sweep spec (TOML or YAML).")]
SweepDirArg = Annotated[
    str, typer.Argument(metavar="SWEEP_DIR", help="STORAGE/NAME (a path or a URI).")
]
CompareFlag = Annotated[bool, typer.Option("--compare", help="Paired precision comparison mode.")]
NameOption = Annotated[str | None, typer.Option(help="Sweep name (overrides the spec).")]


def _apply_tracking_credentials(path: Path | None) -> Path | None:
    # Applied while the command line is parsed, once for every command that takes the
    # option: MLflow's client reads the two variables wherever the command opens it.
    if path is not None:
        from cluster.tracking_auth import CredentialsError, apply_credentials

        try:
            apply_credentials(path)
        except CredentialsError as exc:
            fail(str(exc))
    return path


TrackingCredentials = Annotated[
    Path | None,
    typer.Option(
        "--tracking-credentials",
        metavar="FILE",
        callback=_apply_tracking_credentials,
        help="MLflow credentials: a file of MLFLOW_TRACKING_USERNAME=/MLFLOW_TRACKING_PASSWORD= "
        "lines (mode 0600; `hpo tracking-server` writes STORE/auth/sweep.credentials) or a "
        "mounted Secret directory (default: MLflow's own variables).",
    ),
]


class UserError(Exception):
    """An error caused by input; printed without a traceback, exit code 2."""


def fail(message: str) -> NoReturn:
    raise UserError(message)


def check_tracking_access(
    tracking_uri: str, credentials: Path | None, timeout_s: float = 10.0
) -> bool:
    """Fail with a message naming the variables or ``credentials`` when an HTTP tracking
    server refuses them (401/403), before a command starts work. Returns False when the
    server does not answer (the command's own MLflow calls wait for it), else True."""
    from cluster.tracking_auth import TrackingAccessError, TrackingUnreachableError, check_access

    try:
        check_access(tracking_uri, credentials, timeout_s=timeout_s)
    except TrackingUnreachableError:
        return False
    except TrackingAccessError as exc:
        fail(str(exc))
    return True


def exit_on_user_error(command: Callable[[], object]) -> None:
    """Run a command line; a UserError is printed (never read as markup) and exits 2."""
    try:
        command()
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(2)


def titled_table(
    title: str, *columns: str, right: Collection[str] = (), **column_style: Any
) -> Table:
    """A left-titled table with these columns, all styled alike (``overflow=...``); the
    columns named in ``right`` are right-justified (numbers)."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        style = {"justify": "right", **column_style} if column in right else column_style
        table.add_column(column, **style)
    return table


def load_sweep_spec(
    spec_path: Path, storage: str | None, tracking_uri: str | None, name: str | None, compare: bool
) -> SweepSpec:
    """The spec file with the command line's overrides (`--compare` implies FIFO: paired
    trials must all finish; a pbt spec is refused, :func:`hpo.spec.load_spec`)."""
    from hpo.spec import SpecError, load_spec

    overrides: dict[str, Any] = {"storage": storage, "tracking_uri": tracking_uri, "name": name}
    try:
        return load_spec(spec_path, overrides, compare=compare)
    except SpecError as exc:
        fail(str(exc))
