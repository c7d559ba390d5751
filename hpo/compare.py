"""The paired precision comparison of a sweep, recomputed from MLflow alone.

    hpo compare --experiment NAME [--tracking-uri URI] [--json FILE] [--html FILE] [--log]

:func:`comparison_from_mlflow` reads the sweep's parent run and its child (trial) runs,
nothing else (no Ray state, no sweep directory), so it works on any sweep, finished or
not, from any machine that reaches the tracking store. :func:`log_comparison` writes the
result back onto the parent run (metrics ``cmp.*``, tags, the JSON + HTML report).

* A trial's Sharpe ratios are its final ones (last logged epoch). Trials are paired by
  ``(model, pair_id)``; every precision is compared with the first (the reference,
  normally f32): contrast ``bf16_vs_f32`` is ``bf16 - f32``. The unit of inference is the
  configuration (``config_id``): its seeds are averaged per precision.
* The verdict is a TOST equivalence test against ``margin`` (:data:`DEFAULT_MARGIN`), per
  family and overall, per split; :data:`VERDICT_SPLIT` is the headline. "worse"/"better"
  are Holm-adjusted over the families' one-sided claims of a contrast and split.
* Trial states: ``completed``, ``diverged``, ``error``, ``unfinished``. A configuration
  enters when every member of every seed pair is completed or diverged (a diverged member
  makes it NaN: excluded and counted); the others are listed with the reason in
  ``Contrast.incomplete``. A bf16 trial that fell back to f32 counts as bf16. Nothing is
  dropped silently; configurations are ordered by ``(model, config_id)``.
* Return-based numbers (pair tests, PBO) read each run's :data:`RETURNS_ARTIFACT`;
  without it they are "not available", with a note.

Every decision and its reason: docs/statistics.md
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit
from urllib.request import url2pathname

import numpy as np
from scipy import stats

from cluster.tracking_auth import redact_uri
from hpo.cost import CostSummary, summarise_cost
from hpo.stats import (
    EXACT_MAX_N,
    PAIRS_NEEDED_CAP,
    PairedComparison,
    additional_pairs_needed,
    compare_paired,
    deflated_sharpe_ratio,
    equivalence_test,
    expected_max_sharpe,
    holm_adjust,
    min_track_record_length,
    probabilistic_sharpe_ratio,
    probability_of_backtest_overfitting,
    sharpe_difference_test,
)
from hpo.tracking import (
    MARGIN_PARAM,
    RETURNS_ARTIFACT,
    ROLE_SWEEP,
    ROLE_TRIAL,
    TAG_CONFIG,
    TAG_FAILURE,
    TAG_FELL_BACK,
    TAG_MODEL,
    TAG_PAIR,
    TAG_PARENT,
    TAG_PRECISION,
    TAG_ROLE,
    TAG_SEED,
    TAG_STATUS,
    TAG_TRIAL,
)

__all__ = [
    "DEFAULT_MARGIN",
    "MARGIN_PARAM",
    "OVERALL",
    "RETURNS_ARTIFACT",
    "VERDICT_SPLIT",
    "Comparison",
    "ComparisonError",
    "Contrast",
    "Overfitting",
    "PairSharpeTest",
    "ScopeComparison",
    "Selection",
    "SplitInference",
    "TrialRecord",
    "TrialReturns",
    "compare_trials",
    "comparison_from_mlflow",
    "comparison_metrics",
    "comparison_tags",
    "contrast_key",
    "log_comparison",
]

OVERALL = "overall"
"""Scope name of the statistics pooled over every model family."""
ALL_PRECISIONS = "all"
"""Selection key of the DSR computed over the trials of every precision together."""
ARTIFACT_DIR = "comparison"
JSON_ARTIFACT = "comparison.json"
HTML_ARTIFACT = "report.html"
SPLITS = ("val", "test")
"""Validation Sharpe (what selection uses) and held-out test Sharpe (reported only)."""
VERDICT_SPLIT = "test"
"""The split whose verdict is the headline (report, CLI, ``cmp.<scope>.verdict`` tag): the
held-out test Sharpe, which no decision of the sweep (selection, early stopping) saw.
Both splits carry a verdict."""
DEFAULT_MARGIN = 0.1
"""Equivalence margin, annualised Sharpe: bf16 counts as "as good" when the centre of the
paired differences is credibly within +-0.1 (the 90% Hodges-Lehmann interval inside it). Why 0.1: it is a tenth of a Sharpe unit, a 10%
change for a strategy with Sharpe 1, and well below the sampling error of one Sharpe
measurement (about sqrt((1 + SR^2 / 2) / years), 1.2 for one year of daily bars), so a
difference inside it is one no backtest of that length could act on. Set it per sweep
before looking at the results."""
EQUIVALENCE_ALPHA = 0.05
"""Level of each one-sided test of the TOST (its interval is the 90% Hodges-Lehmann one)."""
RETURNS_COLUMNS = ("split", "fold", "timestamp", "return")
"""Header of :data:`RETURNS_ARTIFACT` (``trainables.checkpoint.RETURNS_COLUMNS``; not
imported from there, so that reading MLflow needs no torch)."""
PBO_BLOCKS = 16
"""CSCV blocks of the PBO (Bailey et al. 2015's S): C(16, 8) = 12870 splits. With fewer
than 2 bars a block on the common bars, the largest even S that has them is used."""
MIN_TRL_CONFIDENCE = 0.95
"""Confidence at which the MinTRL of the best trial beats a zero Sharpe (the PSR's 0)."""
PAIR_TEST_MIN_BARS = 8
"""Fewest common bars for a pair's Sharpe-difference test (hpo.stats' minimum)."""

# completed: done with a finite validation Sharpe; diverged: done without one (the words
# of hpo.trials); error: Tune gave up on it; unfinished: still to run or running.
TrialState = Literal["completed", "diverged", "error", "unfinished"]
_TERMINAL: frozenset[str] = frozenset({"completed", "diverged"})


class ComparisonError(RuntimeError):
    """The comparison cannot be computed (the message says what is missing)."""


_BAR = np.dtype([("timestamp", "i8"), ("fold", "i8")])
"""A bar of a return series: its timestamp (ns since the epoch, UTC) and fold. Sorted,
these keys are time order (walk-forward validation windows follow each other)."""


@dataclass(frozen=True)
class TrialReturns:
    """A trial's final out-of-sample returns, per split (``val``, ``test``): the bars in
    time order and the strategy return earned over each (:data:`RETURNS_ARTIFACT`)."""

    bars: dict[str, np.ndarray]
    """split -> (T,) structured ``(timestamp, fold)`` keys, sorted, unique."""
    returns: dict[str, np.ndarray]
    """split -> (T,) float64 returns, in the order of ``bars``."""

    @classmethod
    def from_csv(cls, text: str) -> TrialReturns:
        """Parse the artifact; ValueError naming the line on a bad header or row."""
        lines = text.splitlines()
        if not lines or tuple(lines[0].split(",")) != RETURNS_COLUMNS:
            raise ValueError(f"expected the header {','.join(RETURNS_COLUMNS)}")
        rows: dict[str, list[tuple[int, int, float]]] = {split: [] for split in SPLITS}
        for number, line in enumerate(lines[1:], start=2):
            try:
                split, fold, stamp, value = line.split(",")
                when = np.datetime64(stamp.removesuffix("Z"), "ns").astype(np.int64)
                rows[split].append((int(when), int(fold), float(value)))
            except (KeyError, ValueError) as exc:
                raise ValueError(f"line {number}: {line!r} ({exc})") from None
        bars, returns = {}, {}
        for split, found in rows.items():
            keys = np.array([(t, f) for t, f, _ in found], dtype=_BAR)
            values = np.array([v for _, _, v in found], dtype=np.float64)
            order = np.argsort(keys, kind="stable")
            keys, values = keys[order], values[order]
            if keys.size > 1 and np.any(keys[1:] == keys[:-1]):
                raise ValueError(f"{split} returns list a bar twice")
            bars[split], returns[split] = keys, values
        return cls(bars=bars, returns=returns)

    def n_bars(self, split: str) -> int:
        return int(self.bars[split].size)


def aligned_returns(tracks: Sequence[TrialReturns], split: str) -> np.ndarray:
    """(T, N) returns of ``tracks`` on the bars they all have (inner join on timestamp and
    fold), rows in time order: the matrix behind the pair tests and the PBO."""
    common = tracks[0].bars[split]
    for track in tracks[1:]:
        common = np.intersect1d(common, track.bars[split], assume_unique=True)
    columns = []
    for track in tracks:
        _, where, _ = np.intersect1d(
            track.bars[split], common, assume_unique=True, return_indices=True
        )
        columns.append(track.returns[split][where])
    return np.column_stack(columns) if columns else np.empty((0, 0))


def contrast_key(other: str, reference: str) -> str:
    """Name of the contrast ``other - reference``, e.g. ``bf16_vs_f32``."""
    return f"{other}_vs_{reference}"


# ---------------------------------------------------------------------------------------
# Results


@dataclass
class TrialRecord:
    """One child run, as the comparison sees it."""

    run_id: str
    trial_id: str
    model: str
    precision: str
    seed: str
    pair_id: str
    config_id: str
    """The sampled configuration (the seeds of one configuration are averaged)."""
    state: TrialState
    epochs: int
    """Last epoch with a logged validation Sharpe (0 when the curves were not read)."""
    val_sharpe: float
    """Final validation Sharpe: annualised, of the joined validation returns (what the
    trainer logs as ``val_sharpe``); NaN unless completed."""
    test_sharpe: float
    """Final held-out test Sharpe; NaN unless completed."""
    sharpe_per_period: float
    """Final per-period Sharpe of the concatenated validation returns (PSR/DSR input)."""
    skew: float
    kurtosis: float
    """Raw (non-excess) kurtosis of the validation returns."""
    n_obs: int
    psr: float
    """P(true per-period Sharpe > 0); NaN when not computable (see the scope's notes)."""
    fell_back_to_f32: bool
    peak_mem_mb: float
    """Allocator peak on CUDA, process peak RSS on CPU; NaN when not recorded."""
    steps_per_s: float
    failure_reason: str | None
    val_curve: list[tuple[int, float]] = field(default_factory=list)
    """Validation Sharpe per epoch, ``(epoch, value)``."""
    returns: TrialReturns | None = None
    """Final out-of-sample returns (:data:`RETURNS_ARTIFACT`); None when not read."""
    returns_note: str | None = None
    """Why ``returns`` is None for a completed trial (no artifact, unreadable)."""
    time_s: float = math.nan
    """Seconds its epochs took, resumes included (``time_s_total``); NaN when not logged."""
    cpu_s: float = math.nan
    """Process CPU seconds of its epochs (``cpu_s_total``)."""
    gpu_s: float = math.nan
    """GPU share x seconds on CUDA (``gpu_s_total``); 0 off GPU."""
    gpu_fraction: float = math.nan
    """The GPU share it held on CUDA; 0 off GPU."""


@dataclass
class SplitInference:
    """What one contrast concludes on one split, beyond the numbers of the
    :class:`~hpo.stats.PairedComparison` (which holds the Wilcoxon test and the
    Hodges-Lehmann estimate and CI, ``hl_*``)."""

    wilcoxon_method: str
    """Which computation gave ``wilcoxon_pvalue``: ``exact`` (the non-zero differences'
    exact null distribution, ties included, up to 50), ``normal approximation ...``, ``all
    differences zero`` or ``not computed: ...``."""
    margin: float
    """Equivalence margin on the paired Sharpe difference (annualised), as given."""
    wilcoxon_p_bh: float = math.nan
    """Wilcoxon p-value BH-adjusted across the model families of this contrast and split
    (NaN for ``overall`` and where the p-value is not finite)."""
    bh_n_tests: int = 0
    """How many p-values (one per family) were adjusted together; 0 when not adjusted."""
    verdict: str | None = None
    """TOST verdict against ``margin``: ``equivalent`` (the mean's interval inside the
    margin too, no strong skew), ``<other> worse`` / ``<other> better`` (Holm-adjusted),
    ``inconclusive: about N more configurations needed``, ``inconclusive: more than 1,000
    more configurations needed``, ``inconclusive: strongly skewed differences`` or
    ``inconclusive``; None while not computable (``verdict_note`` says why)."""
    equivalence_pvalue: float = math.nan
    """p-value of the two one-sided tests (the larger of the two)."""
    tost_estimate: float = math.nan
    """The Hodges-Lehmann estimate the verdict reads (every difference, zeros included:
    the ``hl_estimate`` of the split's :class:`~hpo.stats.PairedComparison`)."""
    tost_low: float = math.nan
    tost_high: float = math.nan
    """The (1 - 2 alpha) HL interval the verdict reads: equivalent iff inside +-margin."""
    tost_confidence: float = math.nan
    """Achieved confidence of ``[tost_low, tost_high]``."""
    configs_needed: int | None = None
    """When inconclusive: about how many more configurations would decide it (None when
    not estimable, or more than 1,000: ``configs_needed_capped``)."""
    configs_needed_capped: bool = False
    """More than :data:`hpo.stats.PAIRS_NEEDED_CAP` more configurations would be needed."""
    verdict_note: str | None = None
    tost_verdict: str | None = None
    """The signed-rank TOST's own verdict (:func:`hpo.stats.equivalence_test`), before the
    Holm adjustment of the directional claims."""
    pvalue_worse: float = math.nan
    """One-sided p-value of "worse by more than the margin", unadjusted."""
    pvalue_better: float = math.nan
    """One-sided p-value of "better by more than the margin", unadjusted."""
    holm_p_worse: float = math.nan
    """``pvalue_worse`` Holm-adjusted over every one-sided directional claim of this
    contrast and split: both directions of every family (of ``overall`` alone, for it).
    The verdict says "worse" only when this is <= 5%."""
    holm_p_better: float = math.nan
    """``pvalue_better`` Holm-adjusted likewise."""
    holm_n_tests: int = 0
    """How many one-sided p-values were adjusted together (2 per family)."""
    mean_tost_low: float = math.nan
    mean_tost_high: float = math.nan
    """The mean difference's 90% t-interval: "equivalent" needs it inside the margin too."""
    skewness: float = math.nan
    """Sample skewness of the configuration differences (bias-corrected)."""
    diff_sd: float = math.nan
    """Standard deviation of the configuration differences (``sd / margin`` indexes the
    power table)."""
    n_configs: int = 0
    """Configurations behind the verdict (the used ones)."""
    equivalence_withheld: str | None = None
    """Why the signed-rank TOST's "equivalent" was withheld (the mean's interval leaves
    the margin, or the differences are strongly skewed); None when it was not."""
    skewed: bool = False
    """Strongly skewed differences (:data:`hpo.stats.SKEW_LIMIT`, or mean and HL more
    than half the margin apart)."""
    tail_configs: list[str] = field(default_factory=list)
    """Configurations whose difference lies beyond Tukey's fences, most extreme first."""


@dataclass
class PairSharpeTest:
    """The two members of one seed pair on one split: is their Sharpe ratio different,
    on the bars both traded? (:func:`hpo.stats.sharpe_difference_test` of other vs
    reference; statistics > 0 when the other precision's Sharpe is higher.)"""

    n_bars: int
    """Common bars (inner join on timestamp and fold); 0 when not available."""
    difference: float = math.nan
    """Per-period Sharpe of the other member minus the reference's, on those bars."""
    jkm_statistic: float = math.nan
    jkm_pvalue: float = math.nan
    """Jobson-Korkie with Memmel's correction: i.i.d. normal returns assumed; descriptive
    (it rejected 14.5% of equal-Sharpe AR(1), t(4) pairs at 5%, T = 250)."""
    hac_statistic: float = math.nan
    hac_pvalue: float = math.nan
    """Ledoit-Wolf (2008) HAC: allows serial correlation and heavy tails (6.7% at 5% on
    those pairs; the bootstrap 5.2%)."""
    hac_bandwidth: float = math.nan
    boot_pvalue: float = math.nan
    """The pair test: Ledoit-Wolf's studentized circular block bootstrap of the HAC
    statistic (:data:`hpo.stats.BOOTSTRAP_RESAMPLES` resamples, seed 0)."""
    boot_block: int = 0
    """Bars per bootstrap block (``round(T^(1/3))``)."""
    boot_p_bh: float = math.nan
    """``boot_pvalue`` BH-adjusted over the seed pairs of this contrast and split (NaN
    where not finite): the value to read, never the raw one."""
    note: str | None = None
    """Why a number is not available, or hpo.stats' special case."""


@dataclass
class Contrast:
    """One precision against the reference, paired, on both splits.

    The unit of inference is the sampled configuration (``config_id``): the paired
    differences of its seeds are averaged first, because seeds of one configuration are
    not independent pairs. ``val`` / ``test`` are :func:`compare_paired` over those
    configuration means; the per-seed pairs stay listed in ``config_pairs``.
    """

    reference: str
    other: str
    config_ids: list[str]
    """Configurations passed to :func:`compare_paired`, in that order
    (``excluded_indices`` index it)."""
    config_pairs: dict[str, list[str]]
    """Configuration -> its seed pairs (pair ids), every one of them complete."""
    incomplete: dict[str, str]
    """Pairs not compared (yet): pair_id -> why (missing, unfinished or errored member, or
    another seed of its configuration pending)."""
    val: PairedComparison
    test: PairedComparison
    inference: dict[str, SplitInference]
    """Split -> test method, BH adjustment and verdict."""
    pair_tests: dict[str, dict[str, PairSharpeTest]] = field(default_factory=dict)
    """Seed pair -> split -> Sharpe-difference tests of its two members' return series
    (``boot_p_bh`` adjusted over this contrast's pairs of the split)."""

    @property
    def key(self) -> str:
        return contrast_key(self.other, self.reference)

    @property
    def pair_ids(self) -> list[str]:
        """Every seed pair of the compared configurations, in configuration order."""
        return [p for config in self.config_ids for p in self.config_pairs[config]]

    def split(self, name: str) -> PairedComparison:
        return self.val if name == "val" else self.test

    def verdict(self, split: str | None = None) -> str | None:
        return self.inference[split or VERDICT_SPLIT].verdict

    def excluded_config_ids(self, split: str = "val") -> list[str]:
        """Configurations left out of ``split``: a member of one of their seeds diverged."""
        return [self.config_ids[i] for i in self.split(split).excluded_indices]

    def excluded_pair_ids(self, split: str = "val") -> list[str]:
        return [p for config in self.excluded_config_ids(split) for p in self.config_pairs[config]]


@dataclass
class Selection:
    """Deflated Sharpe of the best trial of one scope: the highest Sharpe of the joined
    validation returns (``val_sharpe_per_period``, the number the DSR deflates)."""

    precision: str
    """A precision, or ``all`` for every precision together."""
    n_trials: int
    """Trials tried (every state): the ``N`` of the DSR."""
    n_configs: int
    """Distinct sampled configurations among them."""
    n_candidates: int
    """Completed trials with a usable per-period Sharpe."""
    sr_variance: float
    """Sample variance (ddof=1) of the candidates' per-period Sharpe ratios."""
    expected_max_sharpe: float
    """Per-period Sharpe the best of ``n_trials`` unskilled trials reaches on average."""
    best_trial_id: str | None = None
    best_run_id: str | None = None
    best_val_sharpe: float = math.nan
    best_sharpe_per_period: float = math.nan
    best_psr: float = math.nan
    dsr: float = math.nan
    dsr_by_configs: float = math.nan
    note: str | None = None


@dataclass
class Overfitting:
    """How much of one scope's selection is luck, from its completed trials of every
    precision. NaN means not available; the ``*_note`` says why."""

    n_completed: int
    """Completed trials of the scope (every precision): the N of the PBO."""
    pbo: float = math.nan
    """Probability of backtest overfitting (CSCV, :func:`hpo.stats.probability_of_backtest_overfitting`):
    the share of in-sample/out-of-sample splits of the validation bars where the
    in-sample best trial ranks at or below the median out of sample."""
    pbo_n_blocks: int = 0
    """CSCV blocks used (:data:`PBO_BLOCKS`, fewer on few common bars)."""
    pbo_n_bars: int = 0
    """Validation bars every completed trial has (the T of the PBO)."""
    pbo_note: str | None = None
    min_trl: float = math.nan
    """Minimum track record length (bars) of the best trial's validation Sharpe to beat 0 at
    :data:`MIN_TRL_CONFIDENCE`, selection ignored; inf when that Sharpe is <= 0."""
    min_trl_trial_id: str | None = None
    min_trl_n_obs: int = 0
    """Bars the best trial's validation track actually has (compare with ``min_trl``)."""
    min_trl_note: str | None = None
    min_trl_sr0: float = math.nan
    """The selection-aware MinTRL: bars needed to beat ``min_trl_sr0_benchmark``, the
    Sharpe the best of N unskilled trials reaches (the DSR's SR0, N = every trial tried);
    inf when the best Sharpe is at or below it."""
    min_trl_sr0_benchmark: float = math.nan
    """SR0, per period (``Selection.expected_max_sharpe`` of all precisions)."""
    min_trl_sr0_note: str | None = None
    val_test_spearman: float = math.nan
    """Spearman correlation of validation and test Sharpe across the configurations (each
    the mean of its completed trials, seeds and precisions together: one unit each)."""
    val_test_spearman_pvalue: float = math.nan
    spearman_n: int = 0
    """Configurations in the Spearman correlation."""
    spearman_note: str | None = None


@dataclass
class ScopeComparison:
    """Everything about one model family, or all of them pooled (``overall``)."""

    scope: str
    models: list[str]
    counts: dict[str, dict[str, int]]
    """precision -> trials, completed, diverged, error, unfinished, fell_back."""
    contrasts: dict[str, Contrast]
    selection: dict[str, Selection]
    resources: dict[str, dict[str, float]]
    """precision -> median peak_mem_mb / steps_per_s over trials that recorded them, n."""
    cost: CostSummary
    """What each precision spent and the paired cost ratios (:mod:`hpo.cost`)."""
    overfitting: Overfitting
    notes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """The paired comparison of one sweep; :meth:`to_dict` is JSON-safe."""

    experiment: str
    experiment_id: str
    tracking_uri: str
    """Without credentials (user/password are removed)."""
    parent_run_id: str | None
    reference: str
    precisions: list[str]
    computed_at: str
    confidence: float
    margin: float
    """Equivalence margin on the paired Sharpe difference (annualised Sharpe units)."""
    families: dict[str, ScopeComparison]
    overall: ScopeComparison
    trials: list[TrialRecord]
    notes: list[str] = field(default_factory=list)

    @property
    def scopes(self) -> list[ScopeComparison]:
        """Model families (sorted), then ``overall``."""
        return [*self.families.values(), self.overall]

    @property
    def contrast_keys(self) -> list[str]:
        return [contrast_key(p, self.reference) for p in self.precisions[1:]]

    def scope(self, name: str) -> ScopeComparison:
        return self.overall if name == OVERALL else self.families[name]

    def trials_of(self, scope: str) -> list[TrialRecord]:
        return [t for t in self.trials if scope in (OVERALL, t.model)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (``json.dumps(..., allow_nan=False)`` works): NaN/inf -> None."""
        return _json_safe(self)


def _json_safe(value: Any) -> Any:
    if isinstance(value, PairedComparison):
        return value.to_dict()
    if isinstance(value, TrialReturns):
        # The series are the runs' artifacts; the JSON says how long they are.
        return {f"n_bars_{split}": value.n_bars(split) for split in SPLITS}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Contrast):
            out["key"] = value.key
            out["pair_ids"] = value.pair_ids
            out["val_excluded_pair_ids"] = value.excluded_pair_ids("val")
            out["test_excluded_pair_ids"] = value.excluded_pair_ids("test")
        return out
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    return value


# ---------------------------------------------------------------------------------------
# Reading MLflow


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
    children = _search_all(
        client,
        experiment_id,
        f"tags.`{TAG_ROLE}` = '{ROLE_TRIAL}' and tags.`{TAG_PARENT}` = '{parent.info.run_id}'",
    )
    chosen = _resolve_precisions(precisions, parent, children)
    if margin is None:
        margin = _sweep_margin(parent, notes)
    if parent.data.tags.get("compare") == "false":
        notes.append(
            "this sweep did not run in compare mode: each precision was searched on its own, "
            "so no trial has a partner in another precision and every pair is pending; only "
            "the per-precision selection statistics (PSR, DSR) apply"
        )
    compared: list[Any] = []
    ignored: dict[str, int] = {}
    for run in children:
        precision = run.data.tags.get(TAG_PRECISION, "?")
        if precision not in chosen:
            ignored[precision] = ignored.get(precision, 0) + 1
            continue
        compared.append(run)
    trials = _read_trials(client, tracking_uri, compared, with_curves, with_returns)
    if ignored:
        notes.append(f"left out trials of precisions not compared: {ignored}")
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
    )


def compare_trials(
    trials: Sequence[TrialRecord],
    precisions: Sequence[str],
    *,
    confidence: float = 0.95,
    margin: float = DEFAULT_MARGIN,
    experiment: str = "",
    experiment_id: str = "",
    tracking_uri: str = "",
    parent_run_id: str | None = None,
    notes: Sequence[str] = (),
) -> Comparison:
    """The comparison of ``trials`` (already read), reference precision first.

    The computation behind :func:`comparison_from_mlflow`, without MLflow: trials of
    other precisions must already be left out. The remaining arguments are recorded in
    the result as they are given (``tracking_uri`` without credentials).
    """
    if not (math.isfinite(margin) and margin > 0.0):
        raise ComparisonError(f"margin must be a finite Sharpe difference > 0, got {margin!r}")
    settings = _Settings(confidence, margin, {})
    chosen = list(precisions)
    records = sorted(
        trials, key=lambda t: (t.model, t.pair_id, chosen.index(t.precision), t.trial_id)
    )
    all_notes = list(notes)
    if not records:
        all_notes.append("no trial runs of the compared precisions yet")
    families = {
        model: _scope(model, [t for t in records if t.model == model], chosen, settings)
        for model in sorted({t.model for t in records})
    }
    overall = _scope(OVERALL, records, chosen, settings)
    _adjust_across_families(list(families.values()))
    for contrast in overall.contrasts.values():
        for split in SPLITS:
            _holm([contrast.inference[split]], contrast.other)
    return Comparison(
        experiment=experiment,
        experiment_id=experiment_id,
        tracking_uri=redact_uri(tracking_uri),
        parent_run_id=parent_run_id,
        reference=chosen[0],
        precisions=chosen,
        computed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        confidence=confidence,
        margin=margin,
        families=families,
        overall=overall,
        trials=records,
        notes=all_notes,
    )


def _search_all(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=filter_string, max_results=1000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


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


def _resolve_precisions(
    precisions: Sequence[str] | None, parent: Any, children: list[Any]
) -> list[str]:
    if precisions is None:
        chosen: list[str] = []
        raw = parent.data.params.get("precisions")
        if raw:
            try:
                parsed = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                parsed = None
            if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
                chosen = parsed
        if not chosen:
            seen = sorted({r.data.tags.get(TAG_PRECISION, "?") for r in children})
            chosen = sorted(seen, key=lambda p: (p != "f32", p))
    else:
        chosen = list(precisions)
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
    place from a file store): under the GIL threads only add switching, and 16 of them
    read 2,000 trials in 1.3x the time of one (bench/README.md, "Comparison at scale").
    Up to :data:`_READ_THREADS` when some read waits on a server (a tracking server or
    database, an object store)."""
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
        model=tags.get(TAG_MODEL, "?"),
        precision=tags.get(TAG_PRECISION, "?"),
        seed=tags.get(TAG_SEED, ""),
        pair_id=tags.get(TAG_PAIR, run.info.run_id),
        # Runs logged before the tag was named config_id carry it as group_id.
        config_id=tags.get(TAG_CONFIG, tags.get("group_id", tags.get(TAG_PAIR, run.info.run_id))),
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
    text, reason = _returns_text(client, run)
    if text is None:
        return None, f"no returns artifact {RETURNS_ARTIFACT} ({reason})"
    try:
        returns = _parse_returns(text)
    except ValueError as exc:
        return None, f"returns artifact {RETURNS_ARTIFACT} unreadable: {exc}"
    if end:
        with _RETURNS_CACHE_LOCK:
            _RETURNS_CACHE[key] = returns
            while len(_RETURNS_CACHE) > _RETURNS_CACHE_SIZE:
                _RETURNS_CACHE.popitem(last=False)
    return returns, None


def _returns_text(client: Any, run: Any) -> tuple[str | None, str]:
    """The text of the run's returns artifact, or None and the first line of the error."""
    import tempfile

    from mlflow.exceptions import MlflowException

    local = _local_artifact_path(run)
    if local is not None:
        # A file artifact store (an embedded sweep's): the artifact is a file here, and
        # download_artifacts would fetch the run again and copy the file to a temp dir.
        # When the read fails, MLflow's does too and says why in its words, as before.
        with contextlib.suppress(OSError, UnicodeDecodeError):
            return (local / RETURNS_ARTIFACT).read_text(encoding="utf-8"), ""
    try:
        with tempfile.TemporaryDirectory(prefix="hpo-returns-") as tmp:
            path = client.download_artifacts(run.info.run_id, RETURNS_ARTIFACT, tmp)
            with open(path, encoding="utf-8") as fh:
                return fh.read(), ""
    except (MlflowException, OSError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, reason[:200]


def _parse_returns(text: str) -> TrialReturns:
    """:meth:`TrialReturns.from_csv`, with the columns parsed as arrays (row by row, the
    timestamps took most of a trial's read); any text it does not take goes to
    ``from_csv``, for its result or its error naming the line."""
    try:
        lines = text.splitlines()
        if not lines or tuple(lines[0].split(",")) != RETURNS_COLUMNS:
            raise ValueError
        rows = [line.split(",") for line in lines[1:]]
        if any(len(row) != len(RETURNS_COLUMNS) for row in rows):
            raise ValueError
        columns = tuple(zip(*rows, strict=True)) or ((), (), (), ())
        split = np.array(columns[0], dtype=str)  # (N,)
        if not set(columns[0]) <= set(SPLITS):
            raise ValueError
        fold = np.fromiter(map(int, columns[1]), np.int64, len(rows))
        stamps = [stamp.removesuffix("Z") for stamp in columns[2]]
        when = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
        value = np.fromiter(map(float, columns[3]), np.float64, len(rows))
        bars, returns = {}, {}
        for name in SPLITS:
            mine = np.flatnonzero(split == name)
            # Stable, by timestamp then fold: the order of from_csv's sort of the keys.
            mine = mine[np.lexsort((fold[mine], when[mine]))]
            keys = np.empty(mine.size, dtype=_BAR)
            keys["timestamp"], keys["fold"] = when[mine], fold[mine]
            if keys.size > 1 and np.any(keys[1:] == keys[:-1]):
                raise ValueError
            bars[name], returns[name] = keys, value[mine]
    except (ValueError, TypeError, OverflowError):
        return TrialReturns.from_csv(text)
    return TrialReturns(bars=bars, returns=returns)


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


# ---------------------------------------------------------------------------------------
# Statistics of one scope


class _Settings(NamedTuple):
    confidence: float
    margin: float
    pair_tests: dict[tuple[str, str, str], PairSharpeTest]
    """(reference run, other run, split) -> its test: a family's pairs again in overall."""


# Which of two runs of one member the comparison keeps: the one that got furthest.
_STATE_RANK = {"error": 0, "unfinished": 1, "diverged": 2, "completed": 3}


def _scope(
    scope: str, trials: list[TrialRecord], precisions: list[str], settings: _Settings
) -> ScopeComparison:
    notes: list[str] = []
    counts = {p: _counts([t for t in trials if t.precision == p]) for p in precisions}
    reference = precisions[0]
    by_pair: dict[tuple[str, str], dict[str, TrialRecord]] = {}
    for t in trials:
        members = by_pair.setdefault((t.model, t.pair_id), {})
        kept = members.get(t.precision)
        if kept is not None:
            # Two runs of one member: a sweep from before OOM retries continued their
            # member's run left the failed attempt beside the retry. Trial ids are not
            # chronological, so keep the attempt that got furthest, not the first id.
            dropped = kept
            if _STATE_RANK[t.state] > _STATE_RANK[kept.state]:
                members[t.precision] = kept = t
            else:
                dropped = t
            notes.append(
                f"pair {t.pair_id} has two {t.precision} trials "
                f"({kept.trial_id}, {dropped.trial_id}); kept {kept.trial_id} ({kept.state})"
            )
            continue
        members[t.precision] = t
    contrasts = {}
    for other in precisions[1:]:
        contrast = _contrast(by_pair, reference, other, settings)
        contrasts[contrast.key] = contrast
    missing_moments = sum(t.state == "completed" and not math.isfinite(t.psr) for t in trials)
    if missing_moments:
        notes.append(
            f"PSR not computable for {missing_moments} completed trial(s): per-period Sharpe, "
            "skew, kurtosis or n_obs not logged or inconsistent"
        )
    selection = {p: _selection(p, [t for t in trials if t.precision == p]) for p in precisions}
    selection[ALL_PRECISIONS] = _selection(ALL_PRECISIONS, trials)
    return ScopeComparison(
        scope=scope,
        models=sorted({t.model for t in trials}),
        counts=counts,
        contrasts=contrasts,
        selection=selection,
        resources={p: _resources([t for t in trials if t.precision == p]) for p in precisions},
        cost=summarise_cost(trials, precisions, settings.confidence),
        overfitting=_overfitting(trials, selection[ALL_PRECISIONS]),
        notes=notes,
    )


def _overfitting(trials: list[TrialRecord], best: Selection) -> Overfitting:
    completed = [t for t in trials if t.state == "completed"]
    out = Overfitting(n_completed=len(completed))
    _pbo(completed, out)
    _min_trl(
        next((t for t in completed if t.trial_id == best.best_trial_id), None),
        best.expected_max_sharpe,
        out,
    )
    # One point per configuration: its seeds and its two members are not independent.
    by_config: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for t in completed:
        if math.isfinite(t.val_sharpe) and math.isfinite(t.test_sharpe):
            by_config.setdefault((t.model, t.config_id), []).append((t.val_sharpe, t.test_sharpe))
    pairs = [tuple(np.mean(values, axis=0)) for _, values in sorted(by_config.items())]
    out.spearman_n = len(pairs)
    if len(pairs) < 3:
        out.spearman_note = f"not available: {len(pairs)} configuration(s), 3 needed"
    elif len({v for v, _ in pairs}) == 1 or len({t for _, t in pairs}) == 1:
        out.spearman_note = "not available: validation or test Sharpe is the same for all"
    else:
        rho = stats.spearmanr([v for v, _ in pairs], [t for _, t in pairs])
        out.val_test_spearman = float(rho.statistic)
        out.val_test_spearman_pvalue = float(rho.pvalue)
    return out


def _pbo(completed: list[TrialRecord], out: Overfitting) -> None:
    if len(completed) < 2:
        out.pbo_note = f"not available: {len(completed)} completed trial(s), 2 needed"
        return
    missing = [t.trial_id for t in completed if t.returns is None]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        out.pbo_note = (
            f"not available: {len(missing)} of {len(completed)} completed trials have no "
            f"returns artifact ({shown}); a PBO over the others would be another quantity"
        )
        return
    matrix = aligned_returns([t.returns for t in completed], "val")  # type: ignore[misc]
    n_bars = int(matrix.shape[0])
    out.pbo_n_bars = n_bars
    n_blocks = min(PBO_BLOCKS, n_bars // 2 // 2 * 2)  # even, 2 bars a block at least
    if n_blocks < 2:
        out.pbo_note = f"not available: {n_bars} validation bars common to every trial"
        return
    if not np.all(np.isfinite(matrix)):
        out.pbo_note = "not available: a non-finite validation return"
        return
    out.pbo = probability_of_backtest_overfitting(matrix, n_blocks=n_blocks)
    out.pbo_n_blocks = n_blocks
    if n_blocks < PBO_BLOCKS:
        out.pbo_note = (
            f"{n_blocks} blocks instead of {PBO_BLOCKS}: only {n_bars} common validation bars "
            "(2 bars a block at least)"
        )


def _min_trl(best: TrialRecord | None, sr0: float, out: Overfitting) -> None:
    if best is None:
        out.min_trl_note = out.min_trl_sr0_note = "not available: no best trial"
        return
    out.min_trl_trial_id, out.min_trl_n_obs = best.trial_id, best.n_obs
    out.min_trl_sr0_benchmark = sr0
    try:
        out.min_trl = min_track_record_length(
            best.sharpe_per_period, 0.0, best.skew, best.kurtosis, MIN_TRL_CONFIDENCE
        )
        out.min_trl_sr0 = min_track_record_length(
            best.sharpe_per_period, sr0, best.skew, best.kurtosis, MIN_TRL_CONFIDENCE
        )
    except ValueError as exc:
        out.min_trl_note = out.min_trl_sr0_note = f"not available: {exc}"
        return
    if math.isinf(out.min_trl):
        out.min_trl_note = "the best trial's Sharpe is <= 0: no track record length suffices"
    if math.isinf(out.min_trl_sr0):
        out.min_trl_sr0_note = (
            "the best trial's Sharpe is at or below SR0, what the best of the unskilled "
            "trials reaches by luck: no track record length suffices"
        )


def _counts(trials: list[TrialRecord]) -> dict[str, int]:
    out = {"trials": len(trials), "completed": 0, "diverged": 0, "error": 0, "unfinished": 0}
    for t in trials:
        out[t.state] += 1
    out["fell_back"] = sum(t.fell_back_to_f32 for t in trials)
    return out


def _contrast(
    by_pair: dict[tuple[str, str], dict[str, TrialRecord]],
    reference: str,
    other: str,
    settings: _Settings,
) -> Contrast:
    incomplete: dict[str, str] = {}
    seed_pairs: dict[tuple[str, str], list[tuple[str, TrialRecord, TrialRecord]]] = {}
    pending: set[tuple[str, str]] = set()
    for (model, pair_id), members in sorted(by_pair.items()):
        a, b = members.get(reference), members.get(other)
        if a is None and b is None:
            continue  # a pair of other precisions only
        config = (model, (a or b).config_id)  # type: ignore[union-attr]
        reasons = [w for w in (_not_ready(p, members.get(p)) for p in (reference, other)) if w]
        if reasons:
            incomplete[pair_id] = "; ".join(reasons)
            pending.add(config)
            continue
        assert a is not None and b is not None
        seed_pairs.setdefault(config, []).append((pair_id, a, b))
    # A configuration enters once every seed of it is done: its mean must not change
    # meaning (2 seeds now, 3 later) from one computation to the next.
    for config in sorted(pending & seed_pairs.keys()):
        for pair_id, _, _ in seed_pairs.pop(config):
            incomplete[pair_id] = f"configuration {config[1]} has a pending seed"
    ordered = sorted(seed_pairs)
    kwargs: dict[str, Any] = {"labels": (reference, other), "confidence": settings.confidence}
    results: dict[str, PairedComparison] = {}
    inference: dict[str, SplitInference] = {}
    for split in SPLITS:
        # Mean over the configuration's seeds; one diverged member makes it NaN, and
        # compare_paired excludes and counts it.
        ref = [float(np.mean([_value(a, split) for _, a, _ in seed_pairs[c]])) for c in ordered]
        oth = [float(np.mean([_value(b, split) for _, _, b in seed_pairs[c]])) for c in ordered]
        results[split], inference[split] = _paired(
            ref, oth, kwargs, settings.margin, [config_id for _, config_id in ordered]
        )
        n_seeds = sum(len(seed_pairs[c]) for c in ordered)
        if n_seeds > len(ordered):
            results[split].notes.append(
                f"{len(ordered)} configuration(s) from {n_seeds} seed pairs: the paired "
                "differences of a configuration's seeds are averaged into one unit"
            )
    return Contrast(
        reference=reference,
        other=other,
        config_ids=[config_id for _, config_id in ordered],
        config_pairs={
            config_id: [p for p, _, _ in seed_pairs[(m, config_id)]] for m, config_id in ordered
        },
        incomplete=incomplete,
        val=results["val"],
        test=results["test"],
        inference=inference,
        pair_tests=_pair_tests(
            [(pair_id, a, b) for c in ordered for pair_id, a, b in seed_pairs[c]], settings
        ),
    )


def _pair_tests(
    pairs: list[tuple[str, TrialRecord, TrialRecord]], settings: _Settings
) -> dict[str, dict[str, PairSharpeTest]]:
    """Every seed pair's tests per split, with the bootstrap p-values BH-adjusted over the
    pairs of each split (the family's own; ``overall`` adjusts over all of them)."""
    out: dict[str, dict[str, PairSharpeTest]] = {pair_id: {} for pair_id, _, _ in pairs}
    for split in SPLITS:
        for pair_id, a, b in pairs:
            key = (a.run_id, b.run_id, split)
            if key not in settings.pair_tests:
                settings.pair_tests[key] = _pair_test(a, b, split)
            out[pair_id][split] = dataclasses.replace(settings.pair_tests[key])
        tests = [by[split] for by in out.values() if math.isfinite(by[split].boot_pvalue)]
        if tests:
            q = stats.false_discovery_control([t.boot_pvalue for t in tests], method="bh")
            for test, value in zip(tests, q, strict=True):
                test.boot_p_bh = float(value)
    return out


def _pair_test(reference: TrialRecord, other: TrialRecord, split: str) -> PairSharpeTest:
    """Bootstrap, HAC and JKM tests of ``other`` vs ``reference`` on their common bars."""
    for member in (reference, other):
        if member.state != "completed":
            return PairSharpeTest(0, note=f"not available: {member.trial_id} {member.state}")
        if member.returns is None:
            why = member.returns_note or "returns not read"
            return PairSharpeTest(0, note=f"not available: {member.trial_id}: {why}")
    joined = aligned_returns([other.returns, reference.returns], split)  # type: ignore[list-item]
    n_bars = int(joined.shape[0])
    if n_bars < PAIR_TEST_MIN_BARS:
        return PairSharpeTest(
            n_bars, note=f"not available: {n_bars} common bars, {PAIR_TEST_MIN_BARS} needed"
        )
    if not np.all(np.isfinite(joined)):
        return PairSharpeTest(n_bars, note="not available: a non-finite return")
    jkm = sharpe_difference_test(joined[:, 0], joined[:, 1], method="jkm")
    hac = sharpe_difference_test(joined[:, 0], joined[:, 1], method="hac")
    boot = sharpe_difference_test(joined[:, 0], joined[:, 1], method="bootstrap")
    return PairSharpeTest(
        n_bars=n_bars,
        difference=jkm.difference,
        jkm_statistic=jkm.statistic,
        jkm_pvalue=jkm.pvalue,
        hac_statistic=hac.statistic,
        hac_pvalue=hac.pvalue,
        hac_bandwidth=hac.bandwidth,
        boot_pvalue=boot.pvalue,
        boot_block=boot.block_size,
        note=jkm.note or hac.note or None,
    )


def _value(trial: TrialRecord, split: str) -> float:
    return trial.val_sharpe if split == "val" else trial.test_sharpe


def _paired(
    a: list[float], b: list[float], kwargs: dict[str, Any], margin: float, config_ids: list[str]
) -> tuple[PairedComparison, SplitInference]:
    """:func:`compare_paired` (its Wilcoxon is :func:`hpo.stats.paired_signed_rank_test`,
    its CI the Hodges-Lehmann one) plus the method label and the equivalence test; the
    verdict waits for the Holm adjustment (:func:`_holm`)."""
    result = _compare(a, b, kwargs)
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    used = np.isfinite(diff)
    diff = diff[used]  # (n_used,) the configurations compare_paired used
    inference = SplitInference(wilcoxon_method=_wilcoxon_method(result), margin=margin)
    if diff.size == 0:
        inference.verdict_note = "no configuration with both members finite"
        return result, inference
    names = [c for c, ok in zip(config_ids, used, strict=True) if ok]
    _equivalence(diff, margin, kwargs["labels"][1], inference, names)
    return result, inference


def _wilcoxon_method(result: PairedComparison) -> str:
    if not result.wilcoxon_method:
        return "not computed: fewer than 2 configurations"
    if result.wilcoxon_n_nonzero == 0:
        return "all differences zero"
    if result.wilcoxon_method == "normal":
        return f"normal approximation (more than {EXACT_MAX_N} non-zero differences)"
    return result.wilcoxon_method


def _equivalence(
    diff: np.ndarray, margin: float, other: str, inference: SplitInference, names: list[str]
) -> None:
    """The TOST of ``diff`` (n >= 1) against ``margin``, without the directional verdict."""
    tost = equivalence_test(diff, margin, EQUIVALENCE_ALPHA, other=other)
    inference.equivalence_pvalue = tost.pvalue
    inference.tost_estimate, inference.tost_low, inference.tost_high = (
        tost.estimate,
        tost.low,
        tost.high,
    )
    inference.tost_confidence = tost.confidence
    inference.tost_verdict = tost.verdict
    inference.pvalue_worse, inference.pvalue_better = tost.pvalue_worse, tost.pvalue_better
    inference.mean_tost_low, inference.mean_tost_high = tost.mean_low, tost.mean_high
    inference.skewness = tost.skewness
    inference.diff_sd = float(np.std(diff, ddof=1)) if diff.size > 1 else math.nan
    inference.n_configs = int(diff.size)
    inference.equivalence_withheld, inference.skewed = tost.blocked, tost.skewed
    inference.configs_needed = tost.pairs_needed
    inference.configs_needed_capped = tost.pairs_needed_capped
    inference.tail_configs = [names[i] for i in tost.tail]
    notes = []
    if diff.size <= 4:
        notes.append(
            f"{diff.size} configuration(s): no one-sided test at {EQUIVALENCE_ALPHA} can "
            "reject with 4 or fewer, so the verdict is inconclusive whatever the data"
        )
    if tost.blocked:
        notes.append(f"equivalence withheld: {tost.blocked}")
    elif tost.skewed:
        notes.append(
            f"the differences are strongly skewed (sample skewness {tost.skewness:+.2f}, mean "
            f"{tost.mean:+.3f} vs pseudo-median {tost.estimate:+.3f})"
        )
    if inference.tail_configs:
        shown = ", ".join(f"{names[i]} ({diff[i]:+.3f})" for i in tost.tail[:5])
        more = f" and {len(tost.tail) - 5} more" if len(tost.tail) > 5 else ""
        notes.append(f"configurations in the tail (beyond 1.5 IQR): {shown}{more}")
    inference.verdict_note = "; ".join(notes) or None
    # Provisional; _holm sets the verdict from the adjusted directional p-values.
    inference.verdict = tost.verdict


def _holm(cells: list[SplitInference], other: str) -> None:
    """Holm over the one-sided directional p-values of ``cells`` (both directions each),
    then each cell's verdict: "worse"/"better" only where the adjusted p is <= 5%."""
    cells = [c for c in cells if math.isfinite(c.pvalue_worse)]
    if not cells:
        return
    raw = [p for c in cells for p in (c.pvalue_worse, c.pvalue_better)]
    adjusted = holm_adjust(raw)
    for i, cell in enumerate(cells):
        cell.holm_p_worse, cell.holm_p_better = float(adjusted[2 * i]), float(adjusted[2 * i + 1])
        cell.holm_n_tests = len(raw)
        _decide(cell, other)


def _decide(inference: SplitInference, other: str) -> None:
    alpha = EQUIVALENCE_ALPHA
    raw = inference.tost_verdict
    if raw == "equivalent":
        verdict = "equivalent"
    elif inference.holm_p_worse <= alpha * (1.0 + 1e-12):
        verdict = f"{other} worse"
    elif inference.holm_p_better <= alpha * (1.0 + 1e-12):
        verdict = f"{other} better"
    else:
        verdict = "inconclusive"
        if raw != "inconclusive":
            # A directional claim lost to the adjustment: plan at the Bonferroni level.
            m = inference.holm_n_tests
            side = -1.0 if raw == f"{other} worse" else 1.0
            distance = abs(abs(inference.tost_estimate) - inference.margin)
            distance /= math.sqrt(math.pi / 3.0)  # the HL's efficiency
            needed, capped = additional_pairs_needed(
                inference.n_configs, inference.diff_sd, distance, alpha / m
            )
            inference.configs_needed, inference.configs_needed_capped = needed, capped
            holm = inference.holm_p_worse if side < 0 else inference.holm_p_better
            note = (
                f"{raw} at 5% on its own, not after the Holm adjustment over {m} one-sided "
                f"claims (Holm p {holm:.3f})"
            )
            inference.verdict_note = "; ".join(n for n in (inference.verdict_note, note) if n)
        elif (
            inference.skewed
            and inference.configs_needed is None
            and not inference.configs_needed_capped
            and abs(inference.tost_estimate) < inference.margin
        ):
            # Towards equivalence, but more configurations would not remove the skew.
            verdict = "inconclusive: strongly skewed differences"
        if inference.configs_needed_capped:
            verdict = f"inconclusive: more than {PAIRS_NEEDED_CAP:,} more configurations needed"
        elif inference.configs_needed and verdict == "inconclusive":
            n = inference.configs_needed
            noun = "configuration" if n == 1 else "configurations"
            verdict = f"inconclusive: about {n} more {noun} needed"
    if verdict in ("equivalent", f"{other} worse", f"{other} better"):
        inference.configs_needed, inference.configs_needed_capped = 0, False
    inference.verdict = verdict


def _compare(a: list[float], b: list[float], kwargs: dict[str, Any]) -> PairedComparison:
    """:func:`compare_paired`, with scipy's RuntimeWarnings (e.g. ks_2samp switching to
    the asymptotic p-value on ties) kept in the result's notes instead of on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = compare_paired(a, b, **kwargs)
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            message = f"scipy: {w.message}"
            if message not in result.notes:
                result.notes.append(message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


def _not_ready(precision: str, trial: TrialRecord | None) -> str:
    if trial is None:
        return f"no {precision} trial yet"
    if trial.state not in _TERMINAL:
        return f"{precision} trial {trial.trial_id} {trial.state}"
    return ""


def _selection(precision: str, trials: list[TrialRecord]) -> Selection:
    candidates = [
        t
        for t in trials
        if t.state == "completed" and math.isfinite(t.val_sharpe) and math.isfinite(t.psr)
    ]
    n_trials = len(trials)
    n_configs = len({(t.model, t.config_id) for t in trials})
    srs = np.array([t.sharpe_per_period for t in candidates], dtype=np.float64)
    variance = float(np.var(srs, ddof=1)) if srs.size >= 2 else 0.0
    selection = Selection(
        precision=precision,
        n_trials=n_trials,
        n_configs=n_configs,
        n_candidates=len(candidates),
        sr_variance=variance,
        expected_max_sharpe=expected_max_sharpe(variance, max(n_trials, 1)),
    )
    if not candidates:
        selection.note = "no completed trial with a per-period Sharpe and its moments"
        return selection
    # Ranked on the number the DSR deflates: the joined validation track's per-period
    # Sharpe (val_sharpe is the same series annualised in runs of the current trainer).
    best = max(candidates, key=lambda t: (t.sharpe_per_period, t.trial_id))
    selection.best_trial_id = best.trial_id
    selection.best_run_id = best.run_id
    selection.best_val_sharpe = best.val_sharpe
    selection.best_sharpe_per_period = best.sharpe_per_period
    selection.best_psr = best.psr
    args = (best.n_obs, best.skew, best.kurtosis)
    selection.dsr = deflated_sharpe_ratio(best.sharpe_per_period, variance, n_trials, *args)
    selection.dsr_by_configs = deflated_sharpe_ratio(
        best.sharpe_per_period, variance, max(n_configs, 1), *args
    )
    if len(candidates) < 2:
        selection.note = "one usable trial: no variance across trials, the DSR equals the PSR"
    return selection


def _resources(trials: list[TrialRecord]) -> dict[str, float]:
    mem = [t.peak_mem_mb for t in trials if math.isfinite(t.peak_mem_mb)]
    speed = [t.steps_per_s for t in trials if math.isfinite(t.steps_per_s)]
    return {
        "peak_mem_mb": float(np.median(mem)) if mem else math.nan,
        "steps_per_s": float(np.median(speed)) if speed else math.nan,
        "n_peak_mem_mb": len(mem),
        "n_steps_per_s": len(speed),
    }


def _adjust_across_families(families: list[ScopeComparison]) -> None:
    """Benjamini-Hochberg and Holm across the model families, per contrast and split.

    One BH adjustment is one contrast's Wilcoxon p-values on one split, one per family with
    a finite p-value (``bh_n_tests`` of them): validation and test answer two questions and
    are adjusted separately, not as one family of 2 x families tests. Holm controls the
    family-wise error of the verdicts' directional claims: both one-sided p-values of
    every family of the contrast and split (``holm_n_tests``), then each verdict.
    """
    keys = sorted({key for scope in families for key in scope.contrasts})
    for key in keys:
        for split in SPLITS:
            cells = [
                scope.contrasts[key]
                for scope in families
                if key in scope.contrasts
                and math.isfinite(scope.contrasts[key].split(split).wilcoxon_pvalue)
            ]
            if not cells:
                continue
            raw = np.array([c.split(split).wilcoxon_pvalue for c in cells])
            adjusted = stats.false_discovery_control(raw, method="bh")
            for contrast, q in zip(cells, adjusted, strict=True):
                contrast.inference[split].wilcoxon_p_bh = float(q)
                contrast.inference[split].bh_n_tests = len(cells)
    for key in keys:
        for split in SPLITS:
            members = [s.contrasts[key] for s in families if key in s.contrasts]
            _holm([c.inference[split] for c in members], members[0].other)


# ---------------------------------------------------------------------------------------
# Writing back to the parent run


def comparison_metrics(comparison: Comparison) -> dict[str, float]:
    """The ``cmp.*`` metrics of the parent run (finite values only; a missing metric means
    "not computable", with the reason in the JSON artifact's notes).

    Names: ``cmp.<scope>.<other>_vs_<ref>.<val|test>.<stat>`` for the paired statistics
    (``n_units``: configurations used, seeds averaged; ``n_seed_pairs``: the seed pairs in
    them; ``n_excluded``: configurations with a diverged member; ``n_incomplete``: seed
    pairs not compared yet; ``ci_low`` / ``ci_high``: the Hodges-Lehmann interval, zeros
    included, at the achieved ``ci_confidence``; ``hl_nonzero_estimate``: zeros dropped;
    ``mean_ci_low`` / ``mean_ci_high``: the mean difference's t-interval; ``pvalue_worse``
    / ``pvalue_better`` and their ``holm_p_*``; ``mean_tost_*``, ``skewness``,
    ``diff_sd``), ``cmp.<scope>.<precision>.<count or selection stat>`` and
    ``cmp.<scope>.dsr_best`` / ``cmp.<scope>.n_trials`` for all precisions together;
    ``cmp.<scope>.pbo`` (with ``pbo_n_blocks``, ``pbo_n_bars``), ``cmp.<scope>.min_trl``
    (bars, vs 0) and ``min_trl_sr0`` (vs the DSR's SR0), ``cmp.<scope>.val_test_spearman``
    (:class:`Overfitting`); per seed pair of a family,
    ``cmp.<family>.<other>_vs_<ref>.<split>.<pair_id>.<jkm|hac>_<p|z>`` and ``boot_p`` /
    ``boot_p_bh`` (the Sharpe-difference tests of its two members; ``boot_p_bh`` is the
    one to read); ``cmp.<scope>.<precision>.gpu_hours`` / ``cpu_hours`` and
    ``cmp.<scope>.<other>_vs_<ref>.cost.<stat>`` (:mod:`hpo.cost`). The verdicts are
    tags (:func:`comparison_tags`).
    """
    out: dict[str, float] = {}
    for scope in comparison.scopes:
        prefix = f"cmp.{scope.scope}"
        for key, contrast in scope.contrasts.items():
            for split in SPLITS:
                r = contrast.split(split)
                inference = contrast.inference[split]
                excluded = set(contrast.excluded_config_ids(split))
                values = {
                    "n_units": r.n_pairs_used,
                    "n_seed_pairs": sum(
                        len(pairs)
                        for u, pairs in contrast.config_pairs.items()
                        if u not in excluded
                    ),
                    "n_excluded": r.n_excluded_nonfinite,
                    "n_incomplete": len(contrast.incomplete),
                    f"median_{contrast.reference}": r.median_a,
                    f"median_{contrast.other}": r.median_b,
                    "median_diff": r.median_difference,
                    "mean_diff": r.mean_difference,
                    "mean_ci_low": r.mean_low,
                    "mean_ci_high": r.mean_high,
                    "hl_estimate": r.hl_estimate,
                    "ci_low": r.hl_low,
                    "ci_high": r.hl_high,
                    "ci_confidence": r.hl_confidence,
                    "hl_nonzero_estimate": r.hl_nonzero_estimate,
                    "wilcoxon_p": r.wilcoxon_pvalue,
                    "wilcoxon_p_bh": inference.wilcoxon_p_bh,
                    "equivalence_p": inference.equivalence_pvalue,
                    "tost_low": inference.tost_low,
                    "tost_high": inference.tost_high,
                    "mean_tost_low": inference.mean_tost_low,
                    "mean_tost_high": inference.mean_tost_high,
                    "pvalue_worse": inference.pvalue_worse,
                    "pvalue_better": inference.pvalue_better,
                    "holm_p_worse": inference.holm_p_worse,
                    "holm_p_better": inference.holm_p_better,
                    "skewness": inference.skewness,
                    "diff_sd": inference.diff_sd,
                    "mannwhitney_p": r.mannwhitney_pvalue,
                    "ks_p": r.ks_pvalue,
                }
                for stat, value in values.items():
                    out[f"{prefix}.{key}.{split}.{stat}"] = float(value)
        for precision, counts in scope.counts.items():
            for name, value in counts.items():
                out[f"{prefix}.{precision}.n_{name}"] = float(value)
            sel = scope.selection[precision]
            out[f"{prefix}.{precision}.dsr_best"] = sel.dsr
            out[f"{prefix}.{precision}.psr_best"] = sel.best_psr
            out[f"{prefix}.{precision}.best_val_sharpe"] = sel.best_val_sharpe
            res = scope.resources[precision]
            out[f"{prefix}.{precision}.peak_mem_mb"] = res["peak_mem_mb"]
            out[f"{prefix}.{precision}.steps_per_s"] = res["steps_per_s"]
            spent = scope.cost.by_precision[precision]
            out[f"{prefix}.{precision}.gpu_hours"] = spent.gpu_hours
            out[f"{prefix}.{precision}.cpu_hours"] = spent.cpu_hours
        for other, ratio in scope.cost.ratios.items():
            name = f"{prefix}.{contrast_key(other, comparison.reference)}.cost"
            out[f"{name}.{ratio.basis}_hours_ratio"] = ratio.hours_ratio
            out[f"{name}.{ratio.basis}_hours_ratio_ci_low"] = ratio.ci_low
            out[f"{name}.{ratio.basis}_hours_ratio_ci_high"] = ratio.ci_high
            out[f"{name}.n_configs"] = float(ratio.configs) if ratio.configs else math.nan
            out[f"{name}.trials_per_gpu_ratio"] = ratio.trials_per_gpu
            out[f"{name}.step_speedup"] = ratio.step_speedup
            out[f"{name}.peak_mem_ratio"] = ratio.memory_ratio
        pooled = scope.selection[ALL_PRECISIONS]
        out[f"{prefix}.dsr_best"] = pooled.dsr
        out[f"{prefix}.dsr_best_by_configs"] = pooled.dsr_by_configs
        out[f"{prefix}.n_trials"] = float(pooled.n_trials)
        fit = scope.overfitting
        out[f"{prefix}.pbo"] = fit.pbo
        out[f"{prefix}.pbo_n_blocks"] = float(fit.pbo_n_blocks) if fit.pbo_n_blocks else math.nan
        out[f"{prefix}.pbo_n_bars"] = float(fit.pbo_n_bars) if fit.pbo_n_blocks else math.nan
        out[f"{prefix}.min_trl"] = fit.min_trl
        out[f"{prefix}.min_trl_sr0"] = fit.min_trl_sr0
        out[f"{prefix}.val_test_spearman"] = fit.val_test_spearman
        if scope.scope == OVERALL:
            continue  # the families' pair tests, again
        for key, contrast in scope.contrasts.items():
            for pair_id, by_split in contrast.pair_tests.items():
                for split, test in by_split.items():
                    name = f"{prefix}.{key}.{split}.{pair_id}"
                    out[f"{name}.jkm_p"] = test.jkm_pvalue
                    out[f"{name}.hac_p"] = test.hac_pvalue
                    out[f"{name}.jkm_z"] = test.jkm_statistic
                    out[f"{name}.hac_z"] = test.hac_statistic
                    out[f"{name}.boot_p"] = test.boot_pvalue
                    out[f"{name}.boot_p_bh"] = test.boot_p_bh
    return {k: v for k, v in out.items() if math.isfinite(v)}


NOT_COMPUTED = "not computed"
"""Verdict tag value while a verdict cannot be computed (the JSON's ``verdict_note``)."""


def comparison_tags(comparison: Comparison) -> dict[str, str]:
    """The ``cmp.*`` tags of the parent run: settings, best trials and verdicts.

    Verdicts: ``cmp.<scope>.<other>_vs_<ref>.verdict`` (the :data:`VERDICT_SPLIT` split),
    ``cmp.<scope>.<other>_vs_<ref>.<val|test>.verdict`` and ``...wilcoxon_method`` per
    split, and ``cmp.<scope>.verdict``: the one contrast's verdict, or
    ``<key>: <verdict>; ...`` with several; ``cmp.<scope>.<other>_vs_<ref>.cost``: the
    cost sentence (:meth:`hpo.cost.CostRatio.sentence`).
    """
    tags = {
        "cmp.reference": comparison.reference,
        "cmp.precisions": ",".join(comparison.precisions),
        "cmp.computed_at": comparison.computed_at,
        "cmp.confidence": str(comparison.confidence),
        "cmp.selection_metric": "val_sharpe",
        "cmp.margin": str(comparison.margin),
        "cmp.verdict_split": VERDICT_SPLIT,
        "cmp.unit": "configuration (seeds averaged)",
    }
    for scope in comparison.scopes:
        prefix = f"cmp.{scope.scope}"
        best = scope.selection[ALL_PRECISIONS].best_trial_id
        if best:
            tags[f"{prefix}.best_trial"] = best
        headline = []
        for key, contrast in scope.contrasts.items():
            for split in SPLITS:
                inference = contrast.inference[split]
                tags[f"{prefix}.{key}.{split}.verdict"] = inference.verdict or NOT_COMPUTED
                tags[f"{prefix}.{key}.{split}.wilcoxon_method"] = inference.wilcoxon_method
            verdict = contrast.verdict() or NOT_COMPUTED
            tags[f"{prefix}.{key}.verdict"] = verdict
            headline.append((key, verdict))
            if contrast.other in scope.cost.ratios:
                tags[f"{prefix}.{key}.cost"] = scope.cost.ratios[contrast.other].sentence()
        if len(headline) == 1:
            tags[f"{prefix}.verdict"] = headline[0][1]
        elif headline:
            tags[f"{prefix}.verdict"] = "; ".join(f"{k}: {v}" for k, v in headline)
    return tags


def log_comparison(
    comparison: Comparison,
    tracking_uri: str,
    parent_run_id: str | None = None,
    *,
    report_html: str | None = None,
) -> dict[str, float]:
    """Write the comparison onto the sweep's parent run; returns the metrics logged.

    Statistics go in as metrics (:func:`comparison_metrics`, step 0, so the newest
    computation is the one the MLflow UI shows); the settings go in as tags, not params,
    because MLflow params are immutable and a running sweep is compared again as it
    progresses. Artifacts: ``comparison/comparison.json``, and ``comparison/report.html``
    when the caller passes the rendered report (``report_html``, from
    :func:`dashboards.report.render_report`): presentation is the caller's, so this
    module does not import ``dashboards``.
    """
    import json

    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    run_id = parent_run_id or comparison.parent_run_id
    if run_id is None:
        raise ComparisonError("no parent run to log the comparison on")
    client = MlflowClient(tracking_uri)
    stamp = int(time.time() * 1000)
    metrics = comparison_metrics(comparison)
    tags = comparison_tags(comparison)
    items = [Metric(k, v, stamp, 0) for k, v in metrics.items()]
    # log_batch takes at most 1000 metrics per call.
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start : start + 1000])
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    payload = json.dumps(comparison.to_dict(), indent=1, allow_nan=False)
    client.log_text(run_id, payload, f"{ARTIFACT_DIR}/{JSON_ARTIFACT}")
    if report_html is not None:
        client.log_text(run_id, report_html, f"{ARTIFACT_DIR}/{HTML_ARTIFACT}")
    return metrics
