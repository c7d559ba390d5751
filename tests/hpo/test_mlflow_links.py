"""Links into MLflow's UI: the exact URL form, and, in headless Chromium against a real
``mlflow server``, that they open a sweep's trials in the Model-training runs table (with
the comparison columns, through a saved view) where the plain experiment link opens the
GenAI overview. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest
from mlflow.tracking import MlflowClient

from cluster.tracking_server import TrackingServer, start_tracking_server
from hpo.mlflow_links import (
    MlflowUi,
    column,
    mlflow_ui,
    runs_link,
    saved_view,
    sweep_links,
    trials_filter,
    trials_link,
    view_link,
)
from hpo.tracking import (
    ROLE_TRIAL,
    TAG_FAMILY,
    TAG_PARENT,
    TAG_PRECISION,
    TAG_ROLE,
    start_sweep_run,
)

F = TypeVar("F", bound=Callable[..., Any])
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PARENT = "0123456789abcdef0123456789abcdef"
COLUMNS = [
    column("metrics", "val_sharpe"),
    column("metrics", "test_sharpe"),
    column("tags", TAG_PRECISION),
    column("tags", TAG_FAMILY),
]


def _fragment_query(url: str) -> dict[str, list[str]]:
    """The query the UI's router reads: the one inside the fragment, decoded."""
    fragment = urlsplit(url).fragment
    path, _, query = fragment.partition("?")
    return {"path": [path], **parse_qs(query, keep_blank_values=True, strict_parsing=True)}


# ---------------------------------------------------------------------------------------
# The URL form


def test_runs_link_exact_form() -> None:
    assert runs_link("http://127.0.0.1:5000", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
    assert runs_link(
        "http://127.0.0.1:5000/",
        "7",
        search_filter="tags.`hpo.role` = 'trial'",
        order_by=column("metrics", "val_sharpe"),
        ascending=True,
    ) == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
        "&searchFilter=tags.%60hpo.role%60%20%3D%20%27trial%27"
        "&orderByKey=metrics.%60val_sharpe%60&orderByAsc=true"
    )


def test_trials_link_filters_to_the_trials_compare_reads_best_first() -> None:
    link = trials_link("https://mlflow.example.com/ui", "12", PARENT)
    assert link == (
        "https://mlflow.example.com/ui/#/experiments/12/runs?workflowType=machine_learning"
        "&searchFilter=tags.%60hpo.role%60%20%3D%20%27trial%27%20and%20"
        f"tags.%60mlflow.parentRunId%60%20%3D%20%27{PARENT}%27"
        "&orderByKey=metrics.%60val_sharpe%60&orderByAsc=false"
    )
    assert _fragment_query(link) == {
        "path": ["/experiments/12/runs"],
        "workflowType": ["machine_learning"],
        "searchFilter": [f"tags.`hpo.role` = 'trial' and tags.`mlflow.parentRunId` = '{PARENT}'"],
        "orderByKey": ["metrics.`val_sharpe`"],
        "orderByAsc": ["false"],
    }
    # The tag names are the tracking module's (the ones `hpo compare` searches by).
    assert trials_filter(PARENT) == (
        f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and tags.`{TAG_PARENT}` = '{PARENT}'"
    )


def test_filter_characters_that_mean_something_in_a_url_are_encoded() -> None:
    # "+" would read as a space (URLSearchParams), "&" and "#" would end the value.
    search = "params.`lr` = '1e+3' and tags.`note` = 'a&b#c/d?e=f'"
    link = runs_link("http://h:5000", "3", search_filter=search)
    query = link.partition("/runs?")[2]
    assert not set(query) & set("+#` '/?") and query.count("&") == 1
    assert _fragment_query(link)["searchFilter"] == [search]


def test_ids_that_would_break_the_filter_or_the_url_are_refused() -> None:
    with pytest.raises(ValueError, match="parent_run_id must be letters"):
        trials_filter("abc' or 1=1 --")
    with pytest.raises(ValueError, match="view_id must be letters"):
        view_link("http://h:5000", "3", "a view")


def test_saved_view_is_mlflows_envelope_and_its_link_carries_only_the_key() -> None:
    view = saved_view(
        "hpo-trials-1",
        "hpo trials",
        now_ms=1_700_000_000_000,
        search_filter=trials_filter(PARENT),
        order_by=column("metrics", "val_sharpe"),
        columns=COLUMNS,
    )
    assert view.view_id == "hpo-trials-1"
    assert view.tag_key == "mlflow.sharedViewState.hpo-trials-1"
    envelope = json.loads(view.tag_value)
    assert envelope == {
        "name": "hpo trials",
        "createdAt": 1_700_000_000_000,
        "updatedAt": 1_700_000_000_000,
        "state": envelope["state"],
    }
    assert json.loads(envelope["state"]) == {
        "searchFilter": trials_filter(PARENT),
        "orderByKey": "metrics.`val_sharpe`",
        "orderByAsc": False,
        "selectedColumns": [
            "metrics.`val_sharpe`",
            "metrics.`test_sharpe`",
            "tags.`precision`",
            "tags.`family`",
        ],
    }
    # A search facet in the query would make the page ignore the view: the link has none.
    assert view_link("http://127.0.0.1:5000", "7", view.view_id) == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
        "&viewStateShareKey=hpo-trials-1"
    )
    with pytest.raises(ValueError, match="at most 20000"):
        saved_view("v", "too wide", now_ms=0, columns=[column("metrics", "m" * 100)] * 200)


@pytest.mark.parametrize(
    ("tracking_uri", "expected"),
    [
        ("http://127.0.0.1:5000", MlflowUi("http://127.0.0.1:5000", None)),
        (
            "https://alice:s3cr3t@mlflow.example.com:8443/mlflow/",
            MlflowUi("https://mlflow.example.com:8443/mlflow", None),
        ),
        (
            "sqlite:////data/sweeps/mlflow.db",
            MlflowUi(
                "http://127.0.0.1:5000",
                "mlflow ui --backend-store-uri sqlite:////data/sweeps/mlflow.db "
                "--host 127.0.0.1 --port 5000",
            ),
        ),
        (
            "file:///home/me/my runs",
            MlflowUi(
                "http://127.0.0.1:5000",
                "mlflow ui --backend-store-uri 'file:///home/me/my runs' "
                "--host 127.0.0.1 --port 5000",
            ),
        ),
        (
            "postgresql://hpo:s3cr3t@db.internal/mlflow",
            MlflowUi(
                "http://127.0.0.1:5000",
                "mlflow ui --backend-store-uri postgresql://db.internal/mlflow "
                "--host 127.0.0.1 --port 5000",
            ),
        ),
    ],
)
def test_mlflow_ui_for_a_tracking_uri(tracking_uri: str, expected: MlflowUi) -> None:
    assert mlflow_ui(tracking_uri) == expected


# ---------------------------------------------------------------------------------------
# In headless Chromium (Debian's `chromium` package; `make chromium` installs it), against
# a real `mlflow server`: one server for the module, so its tests share an xdist worker.

needs_chromium = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)),
    reason=f"{CHROMIUM} not installed (Debian: apt-get install -y chromium)",
)


def in_chromium(test: F) -> F:
    """Skipped without Chromium; slow; the module's server keeps them on one xdist worker."""
    for mark in (
        needs_chromium,
        pytest.mark.slow,
        pytest.mark.timeout(400),
        pytest.mark.xdist_group("mlflow-ui"),
    ):
        test = mark(test)
    return test


WINDOW = (1400, 900)  # the runs table renders only the columns that fit the window


def test_sweep_links_serve_a_local_store_then_open_the_trials(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("sweep-x")
    assert sweep_links(uri, "no-such-sweep", PARENT) == [
        f"MLflow UI: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000"
    ]
    serve, trials = sweep_links(uri, "sweep-x", PARENT)
    assert serve.startswith("MLflow UI: mlflow ui --backend-store-uri sqlite:///")
    assert trials.endswith(trials_link("http://127.0.0.1:5000", experiment_id, PARENT))
    _, runs = sweep_links(uri, "sweep-x", None)  # no sweep record: the experiment's runs
    elsewhere = tmp_path / "elsewhere.db"
    assert len(sweep_links(f"sqlite:///{elsewhere}", "sweep-x", PARENT)) == 1
    assert not elsewhere.exists()  # looking did not create a store
    assert runs.endswith(f"#/experiments/{experiment_id}/runs?workflowType=machine_learning")


def test_sweep_links_print_the_address_of_a_server_that_does_not_answer() -> None:
    """At once: MLflow's own client would retry the dead server for minutes."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lines = sweep_links(f"http://user:secret@127.0.0.1:{port}", "sweep-x", PARENT)
    assert lines == [f"MLflow UI: http://127.0.0.1:{port}"]  # no password, no exception


@dataclass(frozen=True)
class Store:
    server: TrackingServer
    ui: str
    experiment_id: str
    parent_run_id: str


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path) -> Iterator[Store]:
    """A sweep's parent run, its two trials (f32 val Sharpe 1.25, bf16 0.75) and a run that
    is not a trial, served by `mlflow server` on a free port."""
    root = tmp_path_factory.mktemp("mlflow-ui")
    shutil.copyfile(_mlflow_template, root / "mlflow.db")  # schema migrated once per session
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    parent = start_sweep_run(client, "links", {"name": "links"}, compare=True)
    experiment_id = client.get_run(parent).info.experiment_id
    for precision, val in (("bf16", 0.75), ("f32", 1.25)):
        run = client.create_run(
            experiment_id,
            run_name=f"trial-{precision}-okapi",
            tags={
                TAG_PARENT: parent,
                TAG_ROLE: ROLE_TRIAL,
                TAG_FAMILY: "tft",
                TAG_PRECISION: precision,
            },
        ).info.run_id
        client.log_metric(run, "val_sharpe", val)
        client.log_metric(run, "test_sharpe", val / 2)
        client.set_terminated(run)
    client.set_terminated(client.create_run(experiment_id, run_name="unrelated-run").info.run_id)
    server = start_tracking_server(root, port=0)
    try:
        yield Store(server, mlflow_ui(server.uri).base, experiment_id, parent)
    finally:
        server.stop()


class _Page(HTMLParser):
    """The rendered DOM's text nodes, links and runs-table column headers, in order."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.hrefs: list[str] = []
        self.headers: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self._skip += tag in ("script", "style")
        self._in_title = tag == "title"
        if tag == "a" and attributes.get("href"):
            self.hrefs.append(attributes["href"] or "")
        test_id = attributes.get("data-testid") or ""
        if test_id.startswith("sort-header-"):
            self.headers.append(test_id.removeprefix("sort-header-"))

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style")
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip and data.strip():
            self.texts.append(data.strip())

    def location(self) -> dict[str, list[str]]:
        """Where the page says it is: its settings link returns to the current route."""
        (settings,) = [h for h in self.hrefs if h.startswith("#/settings/")]
        (back,) = parse_qs(urlsplit(settings).fragment.partition("?")[2])["returnTo"]
        return _fragment_query("#" + back)

    def matching_runs(self) -> int:
        return int(self.texts[self.texts.index("matching runs") - 1])


def _chromium(url: str, profile: Path, *mode: str) -> str:
    """Run headless Chromium on ``url`` with a fresh profile (the UI keeps the last
    workflow type in localStorage); its stdout."""
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "--virtual-time-budget=15000",
            *mode,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _open(url: str, tmp_path: Path, name: str) -> _Page:
    return _Page(_chromium(url, tmp_path / f"profile-{name}", "--dump-dom"))


def _screenshot(url: str, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / f"{name}.png"
    _chromium(url, tmp_path / f"profile-{name}-shot", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    size = (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"))
    assert size == WINDOW and len(data) > 30_000  # a blank page compresses to a few KB
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy2(shot, ARTIFACTS / f"mlflow-{name}.png")
    return shot


def _assert_model_training_mode(page: _Page) -> None:
    assert page.title.startswith("Runs - ")
    assert "https://www.mlflow.org/docs/latest/ml/" in page.hrefs  # the sidebar's docs link
    assert "Model registry" in page.texts
    assert not [h for h in page.hrefs if "/overview/" in h or "/judges" in h]  # GenAI's nav
    assert "Token Usage" not in page.texts


@in_chromium
def test_plain_experiment_link_opens_the_genai_overview(store: Store, tmp_path: Path) -> None:
    """Why the links exist, and that the Model-training checks below can fail: the link the
    project used to print opens MLflow 3.17's GenAI overview, with no runs table."""
    page = _open(f"{store.ui}/#/experiments/{store.experiment_id}", tmp_path, "plain")
    assert page.title.startswith("Overview - ")
    assert "Token Usage" in page.texts
    assert "https://www.mlflow.org/docs/latest/genai/" in page.hrefs
    assert "matching runs" not in page.texts
    with pytest.raises(AssertionError):
        _assert_model_training_mode(page)


@in_chromium
def test_trials_link_opens_the_trials_in_the_model_training_runs_table(
    store: Store, tmp_path: Path
) -> None:
    link = trials_link(store.ui, store.experiment_id, store.parent_run_id)
    page = _open(link, tmp_path, "trials")
    _assert_model_training_mode(page)
    # The page read the filter and the sort from the link (and kept them in its route).
    location = page.location()
    assert location["searchFilter"] == [trials_filter(store.parent_run_id)]
    assert location["orderByKey"] == ["metrics.`val_sharpe`"]
    assert location["orderByAsc"] == ["false"]
    # Both trials as rows of their own (not nested under the collapsed sweep run), best val
    # Sharpe first; the sweep's run and the other run are filtered out.
    assert page.matching_runs() == 2
    rows = [t for t in page.texts if t.startswith(("trial-", "sweep-", "unrelated-"))]
    assert rows == ["trial-f32-okapi", "trial-bf16-okapi"]
    _screenshot(link, tmp_path, "trials")


@in_chromium
def test_saved_view_link_shows_the_comparison_columns(store: Store, tmp_path: Path) -> None:
    view = saved_view(
        f"hpo-{store.parent_run_id}",
        "hpo trials: links",
        now_ms=int(time.time() * 1000),
        search_filter=trials_filter(store.parent_run_id),
        order_by=column("metrics", "val_sharpe"),
        columns=COLUMNS,
    )
    MlflowClient(store.server.uri).set_experiment_tag(
        store.experiment_id, view.tag_key, view.tag_value
    )
    link = view_link(store.ui, store.experiment_id, view.view_id)
    page = _open(link, tmp_path, "view")
    _assert_model_training_mode(page)
    assert "hpo trials: links" in page.texts  # the page says which saved view it shows
    assert page.location()["searchFilter"] == [trials_filter(store.parent_run_id)]
    assert page.matching_runs() == 2
    assert {"val_sharpe", "test_sharpe", "precision", "family"} <= set(page.headers)
    assert "Dataset" not in page.headers  # the view's columns replace MLflow's defaults
    # Each trial's row: name first, then its values (f32: 1.25 and 0.625; bf16: 0.75, 0.375).
    f32, bf16 = page.texts.index("trial-f32-okapi"), page.texts.index("trial-bf16-okapi")
    assert f32 < bf16
    cells = page.texts[bf16 + 1 :]
    assert {"1.25", "0.625", "0.75", "0.375", "f32", "bf16", "tft"} <= set(cells)
    _screenshot(link, tmp_path, "view")
