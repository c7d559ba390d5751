"""Reading a sweep from MLflow: its parent run, its trial runs and their returns artifacts.

    hpo compare --experiment NAME [--tracking-uri URI] [--json FILE] [--html FILE] [--log]

:func:`comparison_from_mlflow` reads the sweep's parent run and its child (trial) runs,
nothing else (no Ray state, no sweep directory), so it works on any sweep, finished or
not, from any machine that reaches the tracking store, and hands the records to
:func:`~hpo.compare.inference.compare_trials`.

Contract: a trial's Sharpe ratios are its final ones (last logged epoch); its state is
``completed``, ``diverged``, ``error`` or ``unfinished`` (:class:`TrialRecord`); a
completed trial's :data:`RETURNS_ARTIFACT` is read once per finished run (a cache keyed
by the run's end time) and a missing or unreadable one is a note, never an error. Where
the reads wait on a server they run on a pool of threads; the records keep the runs'
order and the first error raises, as one by one.
"""

from __future__ import annotations

import ast
import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

from cluster.tracking_auth import redact_uri
from hpo.compare.inference import DEFAULT_MARGIN, compare_trials
from hpo.compare.records import (
    Comparison,
    ComparisonError,
    TrialRecord,
    TrialReturns,
    TrialState,
)
from hpo.stats import probabilistic_sharpe_ratio
from hpo.tracking import (
    MARGIN_PARAM,
    RETURNS_ARTIFACT,
    ROLE_SWEEP,
    ROLE_TRIAL,
    SEQUENTIAL_ARTIFACT,
    SEQUENTIAL_PARAM,
    TAG_CONFIG,
    TAG_FAILURE,
    TAG_FAMILY,
    TAG_FELL_BACK,
    TAG_PAIR,
    TAG_PARENT,
    TAG_PRECISION,
    TAG_ROLE,
    TAG_SEED,
    TAG_STATUS,
    TAG_TRIAL,
)


def comparison_from_mlflow(
    experiment: str,
    tracking_uri: str,
    precisions: Sequence[str] | None = ("f32", "bf16"),
    *,
    parent_run_id: str | None = None,
    confidence: float = 0.95,
    margin: float | None = None,
    with_curves: bool = True,
    with_returns: bool = True,
) -> Comparison:
    """Recompute the paired comparison of a sweep from its MLflow runs alone.

    Args:
        experiment: MLflow experiment name (= the sweep name).
        tracking_uri: MLflow tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``).
        precisions: Precisions to compare, reference first; ``None`` takes the sweep's own
            list (the parent run's ``precisions`` param, else the child runs' tags with
            f32 first). Trials of other precisions are left out (and say so in ``notes``).
        parent_run_id: The sweep's parent run; default the newest one in the experiment.
        confidence: Requested confidence of the Hodges-Lehmann CI that is reported.
        margin: Equivalence margin on the paired difference of annualised Sharpe ratios,
            fixed before looking at the results; None takes the sweep's own (the parent
            run's param :data:`MARGIN_PARAM`, from the spec's ``[comparison] margin``),
            else :data:`DEFAULT_MARGIN`.
        with_curves: Also read every trial's validation-Sharpe history (for the report).
        with_returns: Also download every completed trial's :data:`RETURNS_ARTIFACT` (the
            pair tests and the PBO need them; without, they are "not available").

    Raises:
        ComparisonError: no such experiment or parent run, or fewer than two precisions.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ComparisonError(
            f"no MLflow experiment named {experiment!r} at {redact_uri(tracking_uri)}; "
            f"experiments there: {names}"
        )
    experiment_id = found.experiment_id
    notes: list[str] = []
    parent = _parent_run(client, experiment_id, parent_run_id, notes)
    chosen = _precisions_asked(precisions, parent)
    if margin is None:
        margin = _sweep_margin(parent, notes)
    if parent.data.tags.get("compare") == "false":
        notes.append(
            "this sweep did not run in compare mode: each precision was searched on its own, "
            "so no trial has a partner in another precision and every pair is pending; only "
            "the per-precision selection statistics (PSR, DSR) apply"
        )
    trials, per_precision = _records_by_page(
        client,
        tracking_uri,
        experiment_id,
        f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and tags.`{TAG_PARENT}` = '{parent.info.run_id}'",
        chosen,
        with_curves,
        with_returns,
    )
    if chosen is None:
        # An old sweep's parent names no precisions: the trials' tags do, known only now,
        # after every trial was read (and a sweep of one precision is refused only now).
        chosen = _precisions_of_trials(per_precision)
    ignored = {p: n for p, n in per_precision.items() if p not in chosen}
    if ignored:
        notes.append(f"left out trials of precisions not compared: {ignored}")
    sequential = _sequential_records(client, parent, notes)
    if sequential and margin != _sweep_margin(parent, []):
        notes.append(
            f"the sequential families' looks keep the sweep's margin; --margin {margin:g} "
            "applies to the fixed-design statistics only"
        )
    return compare_trials(
        trials,
        chosen,
        confidence=confidence,
        margin=margin,
        experiment=experiment,
        experiment_id=experiment_id,
        tracking_uri=tracking_uri,
        parent_run_id=parent.info.run_id,
        notes=notes,
        sequential=sequential,
    )


def _records_by_page(
    client: Any,
    tracking_uri: str,
    experiment_id: str,
    filter_string: str,
    chosen: Sequence[str] | None,
    with_curves: bool,
    with_returns: bool,
) -> tuple[list[TrialRecord], dict[str, int]]:
    """The records of the runs ``filter_string`` finds whose precision is in ``chosen``
    (every run's where None), and the number of runs per precision.

    A page of runs at a time, each turned into records before the next page is searched:
    the MLflow entities of every run at once were the largest thing a 1,000-trial sweep's
    driver held at its end (bench/README.md, "A sweep's per-trial cost")."""
    trials: list[TrialRecord] = []
    per_precision: dict[str, int] = {}
    seen: set[str] = set()
    for page in _search_pages(client, experiment_id, filter_string):
        compared = _runs_to_compare(page, chosen, seen, per_precision)
        del page  # the runs not compared go now, not after the reads
        trials.extend(_read_trials(client, tracking_uri, compared, with_curves, with_returns))
        del compared  # not held while the next page is searched
    return trials, per_precision


def _runs_to_compare(
    page: Sequence[Any], chosen: Sequence[str] | None, seen: set[str], per_precision: dict[str, int]
) -> list[Any]:
    """The runs of ``page`` not seen before whose precision is in ``chosen`` (all where
    None); counts each new run's precision in ``per_precision``."""
    compared: list[Any] = []
    for run in page:
        # MLflow pages by offset, newest run first: a trial run created between two
        # searches (a sweep compared while it runs) repeats a run on the next page.
        if run.info.run_id in seen:
            continue
        seen.add(run.info.run_id)
        precision = run.data.tags.get(TAG_PRECISION, "?")
        per_precision[precision] = per_precision.get(precision, 0) + 1
        if chosen is None or precision in chosen:
            compared.append(run)
    return compared


def _sequential_records(client: Any, parent: Any, notes: list[str]) -> dict[str, Any] | None:
    """A sequential sweep's record per family (the parent run's
    :data:`~hpo.tracking.SEQUENTIAL_ARTIFACT`), or None for a fixed design."""
    import json

    if parent.data.params.get(SEQUENTIAL_PARAM) != "True":
        return None
    text, reason = _artifact_text(client, parent, SEQUENTIAL_ARTIFACT)
    if text is None:
        notes.append(
            f"a sequential comparison with no look logged yet ({SEQUENTIAL_ARTIFACT}: {reason})"
        )
        return None
    try:
        families = json.loads(text)["families"]
    except (ValueError, KeyError, TypeError) as exc:
        notes.append(f"{SEQUENTIAL_ARTIFACT} unreadable ({exc}): the looks are not shown")
        return None
    return dict(families)


SEARCH_PAGE = 200
"""Runs per MLflow search page. A page's runs are loaded as SQLAlchemy objects (every tag,
param and latest metric) before MLflow turns them into its entities: at 1000 per page that
transient load was the peak of a 1000-trial compare sweep's driver (bench/README.md, "A
sweep's per-trial cost"); the entities kept are a fraction of it."""


def _search_page(client: Any, experiment_id: str, filter_string: str, token: str | None) -> Any:
    """One page of runs (MLflow's ``PagedList``: its ``token`` names the next page, and is
    None on the last)."""
    return client.search_runs(
        [experiment_id], filter_string=filter_string, max_results=SEARCH_PAGE, page_token=token
    )


def _search_pages(client: Any, experiment_id: str, filter_string: str) -> Iterator[Any]:
    token = None
    while True:
        page = _search_page(client, experiment_id, filter_string, token)
        token = page.token
        yield page
        del page  # not held while the next page is searched
        if not token:
            return


def _search_all(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    return [run for page in _search_pages(client, experiment_id, filter_string) for run in page]


def _parent_run(client: Any, experiment_id: str, run_id: str | None, notes: list[str]) -> Any:
    if run_id is not None:
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(run_id)
        except MlflowException:
            raise ComparisonError(f"no MLflow run {run_id!r}") from None
        if run.info.experiment_id != experiment_id:
            raise ComparisonError(f"run {run_id!r} is not in this experiment")
        return run
    parents = _search_all(client, experiment_id, f"tags.`{TAG_ROLE}` = '{ROLE_SWEEP}'")
    if not parents:
        raise ComparisonError(
            "the experiment has no sweep parent run (tag hpo.role = sweep); was it made by "
            "`hpo sweep`?"
        )
    parents.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    if len(parents) > 1:
        notes.append(
            f"{len(parents)} sweep parent runs in this experiment; compared the newest, "
            f"{parents[0].info.run_id} (choose another with --parent-run-id)"
        )
    return parents[0]


def _sweep_margin(parent: Any, notes: list[str]) -> float:
    raw = parent.data.params.get(MARGIN_PARAM)
    try:
        value = float(raw) if raw is not None else math.nan
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0.0:
        return value
    if raw is not None:
        notes.append(f"parent run param {MARGIN_PARAM}={raw!r} is not a margin; used the default")
    return DEFAULT_MARGIN


def _precisions_asked(precisions: Sequence[str] | None, parent: Any) -> list[str] | None:
    """The precisions to compare, reference first: those given, else the sweep's own (the
    parent run's ``precisions`` param); None when neither names them."""
    if precisions is not None:
        return _two_or_more(list(precisions))
    raw = parent.data.params.get("precisions")
    if raw:
        try:
            parsed = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, list) and parsed and all(isinstance(p, str) for p in parsed):
            return _two_or_more(parsed)
    return None


def _precisions_of_trials(per_precision: Mapping[str, int]) -> list[str]:
    """The precisions the trials' tags name, f32 first."""
    return _two_or_more(sorted(per_precision, key=lambda p: (p != "f32", p)))


def _two_or_more(chosen: list[str]) -> list[str]:
    if len(chosen) < 2 or len(set(chosen)) != len(chosen):
        raise ComparisonError(
            f"a comparison needs at least two distinct precisions (reference first), got {chosen}"
        )
    return chosen


_READ_THREADS = 16
"""Most threads reading the trials' histories and returns artifacts at once, where the
reads wait on a server (:func:`_read_threads`). MLflow's public client reads one run's
metric history or artifact per call (its bulk history calls serve the UI, not the
client), so a pool is what overlaps the waits."""


def _read_threads(
    tracking_uri: str, runs: Sequence[Any], with_curves: bool, with_returns: bool
) -> int:
    """1 when every read is work in this process (histories from SQLite, artifacts read in
    place from a file store): under the GIL threads only add switching (bench/README.md,
    "Comparison at scale"). Up to :data:`_READ_THREADS` when some read waits on a server
    (a tracking server or database, an object store)."""
    in_process = urlsplit(tracking_uri).scheme in ("", "file", "sqlite")
    histories_wait = with_curves and not in_process
    artifacts_wait = with_returns and any(_local_artifact_path(run) is None for run in runs)
    return min(_READ_THREADS, len(runs)) if histories_wait or artifacts_wait else 1


def _read_trials(
    client: Any, tracking_uri: str, runs: Sequence[Any], with_curves: bool, with_returns: bool
) -> list[TrialRecord]:
    """The records of ``runs``, in their order (with history and returns as asked), read
    on :func:`_read_threads` threads; the first error raises, as one by one."""

    def read(run: Any) -> TrialRecord:
        record = _trial_record(client, run, with_curves)
        if with_returns and record.state == "completed":
            record.returns, record.returns_note = _trial_returns(client, tracking_uri, run)
        return record

    threads = _read_threads(tracking_uri, runs, with_curves, with_returns)
    if threads <= 1:
        return [read(run) for run in runs]
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads, thread_name_prefix="hpo-compare-read")
    try:
        return list(pool.map(read, runs))
    finally:
        # After an error (a store gone away), the runs not started yet are not tried.
        pool.shutdown(wait=True, cancel_futures=True)


def _final(metrics: Mapping[str, float], key: str) -> float:
    value = metrics.get(key)
    return float(value) if value is not None else math.nan


def _trial_record(client: Any, run: Any, with_curves: bool) -> TrialRecord:
    tags, metrics = run.data.tags, run.data.metrics
    status_tag = tags.get(TAG_STATUS)
    val = _final(metrics, "val_sharpe")
    state: TrialState
    if _final(metrics, "diverged") >= 0.5 or status_tag == "diverged":
        state = "diverged"
    elif status_tag == "error" or (status_tag is None and run.info.status == "FAILED"):
        state = "error"
    elif status_tag == "completed" or (status_tag is None and run.info.status == "FINISHED"):
        state = "completed" if math.isfinite(val) else "diverged"
    else:
        state = "unfinished"
    curve: list[tuple[int, float]] = []
    if with_curves:
        history = client.get_metric_history(run.info.run_id, "val_sharpe")
        curve = sorted((int(m.step), float(m.value)) for m in history)
    completed = state == "completed"
    sr = _final(metrics, "val_sharpe_per_period")
    skew = _final(metrics, "val_skew")
    kurtosis = _final(metrics, "val_kurtosis")
    n_obs_raw = _final(metrics, "val_n_obs")
    n_obs = int(n_obs_raw) if math.isfinite(n_obs_raw) else 0
    psr = math.nan
    if completed:
        try:
            psr = probabilistic_sharpe_ratio(sr, 0.0, n_obs, skew, kurtosis)
        except ValueError:
            psr = math.nan  # moments not logged or inconsistent: the scope notes count it
    fell_back = tags.get(TAG_FELL_BACK) == "true" or _final(metrics, "fell_back_to_f32") >= 0.5
    return TrialRecord(
        run_id=run.info.run_id,
        trial_id=tags.get(TAG_TRIAL, run.info.run_id),
        family=tags.get(TAG_FAMILY, "?"),
        precision=tags.get(TAG_PRECISION, "?"),
        seed=tags.get(TAG_SEED, ""),
        pair_id=tags.get(TAG_PAIR, run.info.run_id),
        config_id=tags.get(TAG_CONFIG, tags.get(TAG_PAIR, run.info.run_id)),
        state=state,
        epochs=curve[-1][0] if curve else 0,
        val_sharpe=val if completed else math.nan,
        test_sharpe=_final(metrics, "test_sharpe") if completed else math.nan,
        sharpe_per_period=sr,
        skew=skew,
        kurtosis=kurtosis,
        n_obs=n_obs,
        psr=psr,
        fell_back_to_f32=fell_back,
        peak_mem_mb=_positive(_final(metrics, "peak_mem_mb")),
        steps_per_s=_positive(_final(metrics, "steps_per_s")),
        failure_reason=tags.get(TAG_FAILURE),
        val_curve=curve,
        time_s=_final(metrics, "time_s_total"),
        cpu_s=_final(metrics, "cpu_s_total"),
        gpu_s=_final(metrics, "gpu_s_total"),
        gpu_fraction=_final(metrics, "gpu_fraction"),
    )


_RETURNS_CACHE: OrderedDict[tuple[str, str, int], TrialReturns] = OrderedDict()
"""(tracking URI, run id, run end time) -> the run's parsed returns artifact. Only runs
that ended are cached: a resumed trial ends again later (a new end time), and its
artifact, overwritten in place, is read afresh."""
_RETURNS_CACHE_SIZE = 4096
_RETURNS_CACHE_LOCK = threading.Lock()  # the reader threads share the cache


def _trial_returns(
    client: Any, tracking_uri: str, run: Any
) -> tuple[TrialReturns | None, str | None]:
    """The run's :data:`RETURNS_ARTIFACT`, or None and why (never raises)."""
    end = run.info.end_time
    key = (tracking_uri, run.info.run_id, int(end or 0))
    with _RETURNS_CACHE_LOCK:
        if end and key in _RETURNS_CACHE:
            _RETURNS_CACHE.move_to_end(key)
            return _RETURNS_CACHE[key], None
    text, reason = _artifact_text(client, run, RETURNS_ARTIFACT)
    if text is None:
        return None, f"no returns artifact {RETURNS_ARTIFACT} ({reason})"
    try:
        returns = TrialReturns.from_csv(text)
    except ValueError as exc:
        return None, f"returns artifact {RETURNS_ARTIFACT} unreadable: {exc}"
    if end:
        with _RETURNS_CACHE_LOCK:
            _RETURNS_CACHE[key] = returns
            while len(_RETURNS_CACHE) > _RETURNS_CACHE_SIZE:
                _RETURNS_CACHE.popitem(last=False)
    return returns, None


def _artifact_text(client: Any, run: Any, artifact: str) -> tuple[str | None, str]:
    """The text of the run's ``artifact``, or None and the first line of the error."""
    import tempfile

    from mlflow.exceptions import MlflowException

    local = _local_artifact_path(run)
    if local is not None:
        # A file artifact store (an embedded sweep's): the artifact is a file here, and
        # download_artifacts would fetch the run again and copy the file to a temp dir.
        # When the read fails, MLflow's read fails too and says why in its own words.
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return (local / artifact).read_text(encoding="utf-8"), ""
    try:
        with tempfile.TemporaryDirectory(prefix="hpo-artifact-") as tmp:
            path = client.download_artifacts(run.info.run_id, artifact, tmp)
            with open(path, encoding="utf-8") as fh:
                return fh.read(), ""
    except (MlflowException, OSError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, reason[:200]


def _local_artifact_path(run: Any) -> Path | None:
    """The run's artifact directory when its artifact URI is a local path or ``file:`` URI
    (the schemes MLflow's LocalArtifactRepository serves), else None."""
    uri = run.info.artifact_uri or ""
    parts = urlsplit(uri)
    if parts.scheme == "":
        return Path(uri) if uri else None
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(url2pathname(parts.path))
    return None


def _positive(value: float) -> float:
    return value if math.isfinite(value) and value > 0 else math.nan
