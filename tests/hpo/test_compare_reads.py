"""How ``hpo compare`` reads a sweep's trials from MLflow: returns artifacts of a file
store read in place, a pool of threads where the reads wait on a server, and the result
exactly what reading the runs one by one through ``download_artifacts`` gave; no MLflow
progress bars in the CLI's output.

The store is the one bench/compare_scale.py builds (its child runs tagged as the sweep's
callback tags them), small: 8 trials, one diverged, one still running, one completed
without its returns artifact.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from hpo import compare
from hpo.compare import TrialReturns, mlflow_reader
from hpo.tracking import RETURNS_ARTIFACT, TAG_TRIAL
from tests.bench_scripts import load_bench_script
from trainables import returns_file

from .compare_helpers import returns_csv, synthetic_returns

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 8
DIVERGED, UNFINISHED, NO_RETURNS = 3, 5, 6  # trial numbers (t00003, ...)
BAR_MARKS = ("Downloading artifacts", "it/s]", "%|")  # tqdm's description and bar


def _load_bench() -> ModuleType:
    return load_bench_script("compare_scale.py", "compare_scale_bench")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_bench()


@pytest.fixture(scope="module")
def store(
    bench: ModuleType, tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path
) -> Any:
    root = tmp_path_factory.mktemp("cmp-reads")
    shutil.copyfile(_mlflow_template, root / "mlflow.db")  # migrated already
    return bench.build_store(
        root, TRIALS, diverged=[DIVERGED], unfinished=[UNFINISHED], no_returns=[NO_RETURNS]
    )


def _by_trial(records: list[compare.TrialRecord]) -> dict[str, compare.TrialRecord]:
    return {r.trial_id: r for r in records}


def _read(store: Any) -> list[compare.TrialRecord]:
    """The trials as ``hpo compare`` reads them, on a cold returns cache."""
    mlflow_reader._RETURNS_CACHE.clear()
    result = compare.comparison_from_mlflow(
        store.experiment, store.tracking_uri, parent_run_id=store.parent_run_id
    )
    return result.trials


@pytest.mark.parametrize("pool", [False, True], ids=["as-hpo-compare", "on-the-pool"])
def test_reads_give_the_records_of_one_by_one_reads(
    bench: ModuleType, store: Any, pool: bool
) -> None:
    with bench.one_by_one():
        one_by_one = _read(store)
    downloads: list[str] = []
    history_threads: set[str] = set()
    client_cls = MlflowClient
    download, history = client_cls.download_artifacts, client_cls.get_metric_history

    def spy_download(self: Any, run_id: str, path: str, dst: str | None = None) -> str:
        downloads.append(run_id)
        return download(self, run_id, path, dst)

    def spy_history(self: Any, run_id: str, key: str) -> Any:
        history_threads.add(threading.current_thread().name)
        return history(self, run_id, key)

    with (
        mock.patch.object(client_cls, "download_artifacts", spy_download),
        mock.patch.object(client_cls, "get_metric_history", spy_history),
        bench.on_pool() if pool else contextlib.nullcontext(),
    ):
        records = _read(store)

    assert len(records) == TRIALS
    assert bench.same_records(records, one_by_one)
    # A SQLite + file store is read in this thread (its reads are work, not waits); the
    # pool's threads are named. The artifacts are read in place: MLflow downloads only
    # the missing one (to say why, in its words).
    if pool:
        assert all(name.startswith("hpo-compare-read") for name in history_threads)
    else:
        assert history_threads == {threading.current_thread().name}
    assert downloads == [_by_trial(records)[f"t{NO_RETURNS:05d}"].run_id]


def test_reads_go_on_the_pool_where_they_wait_on_a_server(tmp_path: Path) -> None:
    here, s3 = _fake_run(tmp_path.as_uri()), _fake_run("s3://bucket/r1/artifacts")
    runs = [here] * 40
    assert mlflow_reader._read_threads("sqlite:///m.db", runs, True, True) == 1
    assert mlflow_reader._read_threads("/abs/mlruns", runs, True, True) == 1
    assert mlflow_reader._read_threads("sqlite:///m.db", [*runs, s3], True, True) == 16
    assert mlflow_reader._read_threads("sqlite:///m.db", [*runs, s3], True, False) == 1
    assert mlflow_reader._read_threads("http://127.0.0.1:5000", runs, True, True) == 16
    assert mlflow_reader._read_threads("postgresql://db/mlflow", runs[:3], True, False) == 3
    assert mlflow_reader._read_threads("http://127.0.0.1:5000", runs, False, True) == 1


def test_runs_are_read_a_page_at_a_time(
    bench: ModuleType, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page of runs becomes records before the next page is searched, so the MLflow
    entities alive at once are one page's, not the sweep's (at 1,000 trials they were the
    largest thing the driver held at its end); the records are those of one big page."""
    import gc

    from mlflow.entities import Run

    def runs_alive() -> int:
        return sum(isinstance(o, Run) for o in gc.get_objects())

    whole = _read(store)
    gc.collect()
    before = runs_alive()  # runs earlier tests still reference
    page = 3
    alive: list[int] = []
    read_trials = mlflow_reader._read_trials

    def counting(client: Any, uri: str, runs: Any, *args: Any) -> Any:
        alive.append(runs_alive() - before)
        return read_trials(client, uri, runs, *args)

    monkeypatch.setattr(mlflow_reader, "SEARCH_PAGE", page)
    monkeypatch.setattr(mlflow_reader, "_read_trials", counting)
    paged = _read(store)
    assert len(alive) == math.ceil(TRIALS / page) == 3
    assert max(alive) <= page + 1  # the page's runs and the parent run
    assert [r.run_id for r in paged] == [r.run_id for r in whole]
    assert bench.same_records(paged, whole)


def test_a_run_repeated_on_the_next_page_is_read_once(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow pages by offset, newest first: a trial run created between two searches (a
    sweep compared while it runs) shifts the next page by one, repeating a run."""
    from mlflow.store.entities.paged_list import PagedList

    whole = _read(store)
    search_page = mlflow_reader._search_page
    previous: list[Any] = []
    repeated: list[str] = []

    def shifted(client: Any, experiment_id: str, filter_string: str, token: Any) -> Any:
        page = search_page(client, experiment_id, filter_string, token)
        runs = [*previous[-1:], *page]
        repeated.extend(run.info.run_id for run in previous[-1:])
        previous[:] = list(page)
        return PagedList(runs, page.token)

    monkeypatch.setattr(mlflow_reader, "SEARCH_PAGE", 3)
    monkeypatch.setattr(mlflow_reader, "_search_page", shifted)
    paged = _read(store)
    assert len(repeated) == 2
    assert [r.run_id for r in paged] == [r.run_id for r in whole]


def test_records_hold_what_the_store_holds(bench: ModuleType, store: Any) -> None:
    """Against MLflow's own answers, not against another path of hpo.compare."""
    trials = _by_trial(_read(store))
    client = MlflowClient(store.tracking_uri)
    states = {t: r.state for t, r in trials.items()}
    assert states == {
        f"t{i:05d}": {DIVERGED: "diverged", UNFINISHED: "unfinished"}.get(i, "completed")
        for i in range(TRIALS)
    }
    for trial_id, record in trials.items():
        history = client.get_metric_history(record.run_id, "val_sharpe")
        expected_curve = sorted((m.step, m.value) for m in history)
        assert repr(record.val_curve) == repr(expected_curve)  # NaN of the diverged one too
        run = client.get_run(record.run_id)
        assert run.data.tags[TAG_TRIAL] == trial_id
        if record.state != "completed" or trial_id == f"t{NO_RETURNS:05d}":
            continue
        text = Path(client.download_artifacts(record.run_id, RETURNS_ARTIFACT)).read_text()
        expected = TrialReturns.from_csv(text)
        assert record.returns is not None and record.returns_note is None
        for split in ("val", "test"):
            np.testing.assert_array_equal(record.returns.bars[split], expected.bars[split])
            np.testing.assert_array_equal(record.returns.returns[split], expected.returns[split])
        assert record.returns.n_bars("val") == 2 * bench.VAL_BARS
        assert record.val_sharpe == pytest.approx(run.data.metrics["val_sharpe"])


def test_a_missing_returns_artifact_gives_the_reason(store: Any) -> None:
    missing = _by_trial(_read(store))[f"t{NO_RETURNS:05d}"]
    assert missing.state == "completed" and missing.returns is None
    assert missing.returns_note is not None
    assert missing.returns_note.startswith(f"no returns artifact {RETURNS_ARTIFACT} (")
    assert len(missing.returns_note) > len(f"no returns artifact {RETURNS_ARTIFACT} ()")


def _fake_run(artifact_uri: str, end_time: int | None = 1) -> Any:
    info = SimpleNamespace(run_id="r1", artifact_uri=artifact_uri, end_time=end_time)
    return SimpleNamespace(info=info)


def test_returns_of_a_remote_store_go_through_download_artifacts(tmp_path: Path) -> None:
    text = synthetic_returns(0.05, 0.02, seed=3)
    (tmp_path / "returns.csv").write_text(text)
    client = mock.Mock()
    client.download_artifacts.return_value = str(tmp_path / "returns.csv")
    mlflow_reader._RETURNS_CACHE.clear()
    returns, note = mlflow_reader._trial_returns(
        client, "http://h", _fake_run("s3://b/r1/artifacts")
    )
    assert note is None and returns is not None
    assert client.download_artifacts.call_args.args[:2] == ("r1", RETURNS_ARTIFACT)
    np.testing.assert_array_equal(
        returns.returns["test"], TrialReturns.from_csv(text).returns["test"]
    )

    client.download_artifacts.side_effect = MlflowException("store away\nsecond line")
    mlflow_reader._RETURNS_CACHE.clear()
    returns, note = mlflow_reader._trial_returns(
        client, "http://h", _fake_run("s3://b/r1/artifacts")
    )
    assert returns is None
    assert note == f"no returns artifact {RETURNS_ARTIFACT} (store away)"


def test_an_unreadable_artifact_gives_the_line_and_a_file_store_is_read_in_place(
    tmp_path: Path,
) -> None:
    artifact = tmp_path / "artifacts" / RETURNS_ARTIFACT
    artifact.parent.mkdir(parents=True)
    artifact.write_text("split,fold,timestamp,return\nval,0,2021-01-04T00:00:00Z,oops\n")
    client = mock.Mock()
    mlflow_reader._RETURNS_CACHE.clear()
    run = _fake_run((tmp_path / "artifacts").as_uri())
    returns, note = mlflow_reader._trial_returns(client, "sqlite:///x", run)
    assert returns is None
    assert note == (
        f"returns artifact {RETURNS_ARTIFACT} unreadable: line 2: "
        "'val,0,2021-01-04T00:00:00Z,oops' (could not convert string to float: 'oops')"
    )
    client.download_artifacts.assert_not_called()


def test_the_cache_keeps_ended_runs_only(tmp_path: Path) -> None:
    artifact = tmp_path / "artifacts" / RETURNS_ARTIFACT
    artifact.parent.mkdir(parents=True)
    artifact.write_text(synthetic_returns(0.05, 0.02, seed=4))
    client = mock.Mock()
    client.download_artifacts.side_effect = MlflowException("gone")
    mlflow_reader._RETURNS_CACHE.clear()
    ended, running = (
        _fake_run(str(tmp_path / "artifacts")),
        _fake_run(str(tmp_path / "artifacts"), end_time=None),
    )
    first, _ = mlflow_reader._trial_returns(client, "sqlite:///x", ended)
    assert mlflow_reader._trial_returns(client, "sqlite:///x", running)[0] is not None
    artifact.unlink()
    assert mlflow_reader._trial_returns(client, "sqlite:///x", ended) == (first, None)
    returns, note = mlflow_reader._trial_returns(client, "sqlite:///x", running)
    assert returns is None and note == f"no returns artifact {RETURNS_ARTIFACT} (gone)"


def _shuffled_csv() -> str:
    rng = np.random.default_rng(5)
    text = returns_csv([rng.standard_normal(30), rng.standard_normal(25)], rng.standard_normal(20))
    header, *rows = text.splitlines()
    order = rng.permutation(len(rows))
    # Two folds on one timestamp (sorted by fold within it) and a fractional second.
    extra = ["val,1,2021-01-04T00:00:00Z,0.5", "test,1,2021-03-01T00:00:00.25Z,nan"]
    return "\n".join([header, *[rows[i] for i in order], *extra]) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        synthetic_returns(0.05, -0.02, seed=1),
        _shuffled_csv(),
        "split,fold,timestamp,return\n",
        "split,fold,timestamp,return\nval,0,2021-01-04\n",
        "split,fold,timestamp,return\ntrain,0,2021-01-04T00:00:00Z,0.1\n",
        "split,fold,timestamp,return\nval,0,2021-01-04T00:00:00Z,0.1\nval,0,2021-01-04,0.2\n",
        "split,fold,timestamp,return\nval,x,2021-01-04T00:00:00Z,0.1\n",
        "fold,split,timestamp,return\n",
        "",
    ],
    ids=[
        "sorted",
        "shuffled",
        "empty",
        "short-row",
        "bad-split",
        "twice",
        "bad-fold",
        "header",
        "nothing",
    ],
)
def test_the_array_parse_is_the_row_parse(text: str) -> None:
    """The returns file's parser takes the text as columns where it can: the same records
    and the same errors (naming the line) as a row at a time."""

    def parse() -> Any:
        try:
            out = TrialReturns.from_csv(text)
        except ValueError as exc:
            return f"ValueError: {exc}"
        return {
            split: (out.bars[split].dtype, out.bars[split].tobytes(), out.returns[split].tobytes())
            for split in out.bars
        }

    with mock.patch.object(returns_file, "_parse_columns", lambda lines: None):
        by_rows = parse()
    assert parse() == by_rows


def _run_compare(store: Any, command: list[str], env: dict[str, str]) -> str:
    args = ["compare", "--experiment", store.experiment, "--tracking-uri", store.tracking_uri]
    proc = subprocess.run(
        [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


# A remote store's path: every artifact through MLflow's download_artifacts.
FORCE_DOWNLOADS = (
    "import sys; from hpo.compare import mlflow_reader as c; "
    "c._local_artifact_path = lambda run: None; "
    "from hpo.cli import main; sys.argv[0] = 'hpo'; main()"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reads", "bar_env", "bars"),
    [("in place", None, False), ("downloads", None, False), ("downloads", "true", True)],
)
def test_hpo_compare_prints_no_progress_bars(
    store: Any, reads: str, bar_env: str | None, bars: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"}
    if bar_env is not None:
        env["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar_env  # an explicit value is kept
    hpo = str(Path(sys.executable).with_name("hpo"))
    command = [hpo] if reads == "in place" else [sys.executable, "-c", FORCE_DOWNLOADS]
    output = _run_compare(store, command, env)
    assert "verdict" in output.lower(), output
    shown = [line for line in output.splitlines() if any(m in line for m in BAR_MARKS)]
    # With bars asked for, each completed trial's download draws one (the check sees them).
    assert bool(shown) == bars, shown
    if bars:
        # The diverged and the running trial read none, the one without has none to show.
        assert output.count("Downloading artifacts: 100%") >= TRIALS - 3


def test_the_cli_turns_mlflow_progress_bars_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpo import cli
    from hpo.cli import _app

    seen: list[str | None] = []
    # Restored after the test, whatever run() sets.
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "unset")
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    monkeypatch.setattr(
        _app,  # where run() looks it up
        "exit_on_user_error",
        lambda app: seen.append(os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")),
    )
    cli.run()
    assert seen == ["false"]
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is False


def test_nan_in_curves_compares_equal_in_the_bench(bench: ModuleType) -> None:
    from .compare_helpers import trial_record

    a, b = trial_record("tft", "f32", 0, 0, 0.5), trial_record("tft", "f32", 0, 0, 0.5)
    a.val_curve, b.val_curve = [(1, 0.1), (2, math.nan)], [(1, 0.1), (2, math.nan)]
    assert bench.same_records([a], [b])
    b.val_curve = [(1, 0.1), (2, 0.2)]
    assert not bench.same_records([a], [b])


def test_the_bench_times_the_search_apart(bench: ModuleType, store: Any) -> None:
    timing = bench.time_compare(store, bench.NOW)
    assert timing.trials == TRIALS and len(timing.records) == TRIALS
    assert timing.search_s > 0 and timing.reads_s > 0 and timing.stats_s > 0
    assert timing.per_trial_s == pytest.approx((timing.reads_s + timing.stats_s) / TRIALS)
    # The timing wrappers are gone afterwards.
    assert mlflow_reader._search_page.__name__ == "_search_page"
    assert mlflow_reader.compare_trials.__name__ == "compare_trials"


def test_the_first_read_error_raises_and_stops_the_reads() -> None:
    """As one by one: a store that fails raises to the caller, and the runs not started
    yet are not tried (the old loop stopped at the first error too)."""
    import time

    calls: list[str] = []

    def history(run_id: str, key: str) -> list[Any]:
        calls.append(run_id)
        time.sleep(0.01)
        if run_id == "r000":
            raise MlflowException("store away")
        return []

    client = mock.Mock()
    client.get_metric_history.side_effect = history
    runs = [
        SimpleNamespace(
            info=SimpleNamespace(run_id=f"r{i:03d}", status="RUNNING", end_time=None),
            data=SimpleNamespace(tags={}, metrics={}),
        )
        for i in range(200)
    ]
    with pytest.raises(MlflowException, match="store away"):
        mlflow_reader._read_trials(client, "http://127.0.0.1:5000", runs, True, False)
    assert "r000" in calls and len(calls) < 100
