"""Links into MLflow's UI that open the runs table, not the GenAI overview.

MLflow 3's UI opens an experiment in its GenAI overview (traces, token usage) whatever the
experiment's ``mlflow.experimentKind`` tag says; ``workflowType=machine_learning`` in the
runs page's query switches it to "Model training". The query parameters here are the ones
MLflow's frontend reads (checked against the 3.17 bundle, ``mlflow/server/js/build``):

* ``workflowType``: ``genai`` | ``machine_learning`` (the sidebar's workflow switch).
* ``searchFilter``, ``orderByKey``, ``orderByAsc``: the runs page's search facets.
* ``viewStateShareKey``: a saved view, stored as the experiment tag
  ``mlflow.sharedViewState.<key>``; the only way a link can choose the table's columns,
  and ignored when the query also carries a search facet.

Sorting by creation time (MLflow's default) nests child runs under their parent and shows
the parent collapsed, so a link to a sweep's trials sorts them by a metric.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

from cluster.tracking_auth import TrackingAccessError, check_access, redact_uri
from hpo.tracking import ROLE_TRIAL, TAG_PARENT, TAG_ROLE

ColumnKind = Literal["attributes", "metrics", "params", "tags"]

MODEL_TRAINING = "machine_learning"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
MAX_VIEW_TAG_CHARS = 20_000  # MLflow's limit on an experiment tag's value (and the UI's)
DEFAULT_UI = "http://127.0.0.1:5000"
_ID = re.compile(r"[A-Za-z0-9_-]+")


class MlflowUi(NamedTuple):
    """Where to open MLflow's UI for a tracking URI."""

    base: str
    """The UI's address, the start of every link (no credentials, no trailing slash)."""
    command: str | None
    """What to run first to serve that UI; None when the tracking server is the UI."""


@dataclass(frozen=True)
class SavedView:
    """A runs-table view for :func:`view_link`: set ``tag_key`` = ``tag_value`` on the
    experiment first (``MlflowClient.set_experiment_tag``); setting it again replaces it."""

    view_id: str
    tag_key: str
    tag_value: str


def mlflow_ui(tracking_uri: str) -> MlflowUi:
    """The UI to print for ``tracking_uri``.

    An ``http(s)`` tracking URI is a tracking server, which serves the UI itself: the base
    is the URI with any user name and password removed. Any other URI (``sqlite:``,
    ``file:``, a directory, a database URL) is a store only ``mlflow ui`` can show: the
    command serves it on ``127.0.0.1:5000``, the base is ``http://127.0.0.1:5000``.
    Credentials are never printed, so a database URL that needs a password has to be
    completed by hand.
    """
    uri = redact_uri(tracking_uri)
    if urlsplit(uri).scheme in ("http", "https"):
        return MlflowUi(uri.rstrip("/"), None)
    command = f"mlflow ui --backend-store-uri {shlex.quote(uri)} --host 127.0.0.1 --port 5000"
    return MlflowUi(DEFAULT_UI, command)


def column(kind: ColumnKind, name: str) -> str:
    """A runs-table column as MLflow's UI names it (``column("metrics", "val_sharpe")`` is
    ``metrics.`val_sharpe```): what ``order_by`` and ``columns`` take."""
    return f"{kind}.`{name}`"


def trials_filter(parent_run_id: str) -> str:
    """The MLflow search filter of a sweep's trial runs (the one ``hpo compare`` uses)."""
    _check_id(parent_run_id, "parent_run_id")
    return f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and tags.`{TAG_PARENT}` = '{parent_run_id}'"


def runs_link(
    ui_base: str,
    experiment_id: str,
    *,
    search_filter: str = "",
    order_by: str | None = None,
    ascending: bool = False,
) -> str:
    """The experiment's runs table in Model-training mode, filtered by ``search_filter``
    (MLflow search syntax) and sorted by the column ``order_by`` (see :func:`column`)."""
    query = {"workflowType": MODEL_TRAINING}
    if search_filter:
        query["searchFilter"] = search_filter
    if order_by is not None:
        query.update(orderByKey=order_by, orderByAsc=str(ascending).lower())
    return _runs_page(ui_base, experiment_id, query)


def trials_link(
    ui_base: str, experiment_id: str, parent_run_id: str, *, metric: str = "val_sharpe"
) -> str:
    """The sweep's trials, best ``metric`` first."""
    return runs_link(
        ui_base,
        experiment_id,
        search_filter=trials_filter(parent_run_id),
        order_by=column("metrics", metric),
    )


def saved_view(
    view_id: str,
    name: str,
    *,
    now_ms: int,
    search_filter: str = "",
    order_by: str | None = None,
    ascending: bool = False,
    columns: Sequence[str] = (),
) -> SavedView:
    """A view the runs page opens from :func:`view_link`: its filter, its sort and the
    ``columns`` it shows (see :func:`column`), listed by ``name`` in the page's Views menu.

    The tag's value is MLflow's saved-view envelope, ``{name, createdAt, updatedAt, state}``
    with ``state`` the page's state as JSON (the form the UI writes when compression is off).
    """
    _check_id(view_id, "view_id")
    state: dict[str, object] = {"searchFilter": search_filter}
    if order_by is not None:
        state.update(orderByKey=order_by, orderByAsc=ascending)
    if columns:
        state["selectedColumns"] = list(columns)
    value = json.dumps(
        {"name": name, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)}
    )
    if len(value) > MAX_VIEW_TAG_CHARS:
        raise ValueError(
            f"saved view {name!r} is {len(value)} characters as a tag; MLflow keeps at most "
            f"{MAX_VIEW_TAG_CHARS}: show fewer columns or shorten the filter"
        )
    return SavedView(view_id, VIEW_TAG_PREFIX + view_id, value)


def view_link(ui_base: str, experiment_id: str, view_id: str) -> str:
    """The runs table as the saved view ``view_id`` (see :func:`saved_view`) shows it."""
    _check_id(view_id, "view_id")
    return _runs_page(
        ui_base, experiment_id, {"workflowType": MODEL_TRAINING, "viewStateShareKey": view_id}
    )


def _runs_page(ui_base: str, experiment_id: str, query: dict[str, str]) -> str:
    # The UI routes inside the fragment, and reads its query with URLSearchParams: encode
    # everything but unreserved characters (a space as %20, never "+").
    return (
        f"{ui_base.rstrip('/')}/#/experiments/{quote(experiment_id, safe='')}/runs?"
        f"{urlencode(query, quote_via=quote)}"
    )


def _check_id(value: str, what: str) -> None:
    if not _ID.fullmatch(value):
        raise ValueError(f"{what} must be letters, digits, '_' or '-', got {value!r}")


def sweep_links(tracking_uri: str, experiment: str, parent_run_id: str | None) -> list[str]:
    """What to print where a command names the MLflow UI: the command that serves a local
    store (when one is needed), then the link to the sweep's trials in the runs table, or
    to the experiment's runs when the sweep's ids cannot be read. Never raises: a tracking
    server that does not answer still gets its address printed."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    ui = mlflow_ui(tracking_uri)
    lines = [f"MLflow UI: {ui.command}" if ui.command else f"MLflow UI: {ui.base}"]
    if ui.command is None:
        # A server: one request with a short timeout first, since MLflow's client retries
        # an unreachable or refusing server for minutes.
        try:
            check_access(tracking_uri, timeout_s=3.0)
        except TrackingAccessError:
            return lines
    elif tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[10:]).is_file():
        return lines  # no store here: opening one would create it
    try:
        found = MlflowClient(tracking_uri).get_experiment_by_name(experiment)
    except (MlflowException, OSError):  # unreachable: the address is all there is
        found = None
    if found is None:
        return lines
    if parent_run_id and _ID.fullmatch(parent_run_id):
        link = trials_link(ui.base, found.experiment_id, parent_run_id)
        lines.append(f"  the trials, best val_sharpe first: {link}")
    else:
        lines.append(f"  the runs: {runs_link(ui.base, found.experiment_id)}")
    return lines
