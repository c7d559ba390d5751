"""The comparison's result records and their JSON.

What a comparison is made of, from one trial (:class:`TrialRecord`, with its return series
:class:`TrialReturns`) up to the whole sweep (:class:`Comparison`): plain dataclasses that
:mod:`hpo.compare.inference` fills, :mod:`hpo.compare.mlflow_writer` logs and
:mod:`dashboards` renders. Nothing here reads or writes MLflow or computes a statistic.

Contract: :meth:`Comparison.to_dict` is JSON-safe (``json.dumps(..., allow_nan=False)``
works; NaN and inf become None, a return series becomes its length per split); the field
names are the keys of ``comparison/comparison.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hpo.cost import CostSummary
from hpo.stats import PairedComparison, Verdict
from trainables.returns_file import SPLITS, parse_returns

OVERALL = "overall"
"""Scope name of the statistics pooled over every family."""
ALL_PRECISIONS = "all"
"""Selection key of the DSR computed over the trials of every precision together."""
VERDICT_SPLIT = "test"
"""The split whose verdict is the headline (report, CLI, ``cmp.<scope>.verdict`` tag): the
held-out test Sharpe, which no decision of the sweep (selection, early stopping) saw.
Both splits carry a verdict."""

# completed: done with a finite validation Sharpe; diverged: done without one (the words
# of hpo.trials); error: Tune gave up on it; unfinished: still to run or running.
TrialState = Literal["completed", "diverged", "error", "unfinished"]


class ComparisonError(RuntimeError):
    """The comparison cannot be computed (the message says what is missing)."""


@dataclass(frozen=True)
class TrialReturns:
    """A trial's final out-of-sample returns, per split (``val``, ``test``): the bars in
    time order and the strategy return earned over each (the trial run's
    :data:`~hpo.tracking.RETURNS_ARTIFACT`, a ``returns.csv``)."""

    bars: dict[str, np.ndarray]
    """split -> (T,) :data:`trainables.returns_file.BAR` keys (timestamp, fold), sorted,
    unique."""
    returns: dict[str, np.ndarray]
    """split -> (T,) float64 returns, in the order of ``bars``."""

    @classmethod
    def from_csv(cls, text: str) -> TrialReturns:
        """Parse the artifact (:func:`trainables.returns_file.parse_returns`); ValueError
        naming the line on a bad header or row."""
        series = parse_returns(text)
        bars, returns = {}, {}
        for split in SPLITS:
            bars[split], returns[split] = series.in_time_order(split)
        return cls(bars=bars, returns=returns)

    def n_bars(self, split: str) -> int:
        return int(self.bars[split].size)


def contrast_key(other: str, reference: str) -> str:
    """Name of the contrast ``other - reference``, e.g. ``bf16_vs_f32``."""
    return f"{other}_vs_{reference}"


@dataclass
class TrialRecord:
    """One child run, as the comparison sees it."""

    run_id: str
    trial_id: str
    family: str
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
    """Final out-of-sample returns (:data:`~hpo.tracking.RETURNS_ARTIFACT`); None when not read."""
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
    other: str
    """The precision compared with the reference (the contrast's ``other``), named in
    :attr:`verdict`."""
    wilcoxon_p_bh: float = math.nan
    """Wilcoxon p-value BH-adjusted across the families of this contrast and split
    (NaN for ``overall`` and where the p-value is not finite)."""
    bh_n_tests: int = 0
    """How many p-values (one per family) were adjusted together; 0 when not adjusted."""
    decision: Verdict | None = None
    """The verdict's decision (:class:`hpo.stats.Verdict`): EQUIVALENT (the mean's interval
    inside the margin too), WORSE / BETTER (Holm-adjusted) or INCONCLUSIVE; None while not
    computable (``verdict_note`` says why). A family of a sequential comparison reads its
    :class:`SequentialRecord`'s rule on the :data:`VERDICT_SPLIT` split instead (after the
    Holm adjustment across families: also FUTILE or CONTINUE), the TOST's staying in
    ``tost_decision``. Code decides from this, never from :attr:`verdict`'s text."""
    decision_note: str | None = None
    """What the verdict says after its decision, or None: ``about N more configurations
    needed``, ``more than 1,000 more configurations needed``; a sequential family's
    ``no decision at ...``, ``... so far``, why a claim lost to the Holm adjustment. Part of
    :attr:`verdict`'s text, unlike ``verdict_note`` (the explanation printed beside it)."""
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
    """Why the verdict reads as it does, printed beside it: too few configurations, why
    equivalence was withheld, skew, the tail line, a claim the Holm adjustment took."""
    tost_decision: Verdict | None = None
    """The signed-rank TOST's own decision (:func:`hpo.stats.equivalence_test`), before the
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
    """The mean difference's 90% interval that the verdict reads (per side the wider of
    the t-interval and the BCa bootstrap's, :func:`hpo.stats.mean_interval`, valid under
    skew): "equivalent" needs it inside the margin too."""
    skewness: float = math.nan
    """Sample skewness of the configuration differences (bias-corrected)."""
    diff_sd: float = math.nan
    """Standard deviation of the configuration differences (``sd / margin`` indexes the
    power table)."""
    n_configs: int = 0
    """Configurations behind the verdict (the used ones)."""
    equivalence_withheld: str | None = None
    """Why the signed-rank TOST's "equivalent" was withheld (the mean's interval leaves
    the margin); None when it was not."""
    skewed: bool = False
    """Strongly skewed differences (:data:`hpo.stats.SKEW_LIMIT`, or mean and HL more
    than half the margin apart): reported (``verdict_note``), not a block."""
    tail_configs: list[str] = field(default_factory=list)
    """Configurations whose difference lies beyond Tukey's fences, most extreme first."""
    tail_line: str | None = None
    """How often the other precision loses more than the margin, with its interval and
    the worst configurations by id (:meth:`hpo.stats.LossTail.line`): said beside the
    verdict, because "equivalent on average" can hide a few configurations it breaks."""

    @property
    def verdict(self) -> str | None:
        """The verdict as people read it (:meth:`hpo.stats.Verdict.text`): ``equivalent``,
        ``<other> worse``, ``inconclusive: about 3 more configurations needed``, ...; None
        while not computable."""
        if self.decision is None:
            return None
        return self.decision.text(self.other, self.decision_note)

    @property
    def tost_verdict(self) -> str | None:
        """``tost_decision`` spelled as :attr:`verdict` is."""
        return None if self.tost_decision is None else self.tost_decision.text(self.other)


@dataclass
class SequentialLookRecord:
    """One look of a family's sequential comparison (:class:`hpo.stats.SequentialLook`)."""

    configs: int
    """Configurations (with a finite difference) the look read."""
    decision: Verdict
    """CONTINUE, EQUIVALENT, WORSE, BETTER or FUTILE."""
    mean: float
    low: float
    """Repeated confidence interval of the mean difference (NaN before
    :data:`hpo.stats.MIN_FIRST_LOOK`)."""
    high: float
    level: float
    """One-sided nominal level of [low, high] (0 before the first look that spends)."""
    hl_estimate: float
    hl_low: float
    hl_high: float
    decision_probability: float
    """The futility rule's predicted probability that the budget's look decides."""


@dataclass
class SequentialRecord:
    """A family of a sequential comparison (``[comparison] sequential = true``): its looks,
    what it stopped on, the repeated p-values and their Holm adjustment across families
    (its verdict follows from them onto its contrast), and what it cost. Recomputed by :func:`hpo.stats.sequential_comparison` from the sweep's record
    of the planned looks and the differences in the order the configurations completed
    (the parent run's ``sequential.json``); the rule being deterministic, the looks are
    those the sweep applied (``recorded_decisions``, a note where they are not)."""

    decision: Verdict
    """The rule's last decision: CONTINUE (still running), EQUIVALENT, WORSE, BETTER or
    FUTILE. The family's verdict, this after the Holm adjustment across families, is its
    contrast's on the :data:`VERDICT_SPLIT` split (``SplitInference.decision`` and
    ``decision_note``)."""
    stopped_on: str | None
    """``decision``, ``futility``, ``budget`` or ``failures``; None while it runs."""
    configs: int
    """Configurations the decision rests on (the last look's)."""
    configs_made: int
    """Configurations the sweep made for the family (replacements and those finished
    after the decision included)."""
    budget: int
    plan: list[int]
    """The planned looks (cumulative configurations), the last the budget."""
    margin: float
    alpha: float
    metric: str
    """What the differences are of (``test_sharpe``)."""
    looks: list[SequentialLookRecord]
    p_worse: float
    """Repeated p-value of "worse by more than the margin" over the looks reached."""
    p_better: float
    holm_p_worse: float = math.nan
    """``p_worse`` Holm-adjusted over both directions of every sequential family."""
    holm_p_better: float = math.nan
    holm_n_tests: int = 0
    tail: str | None = None
    """The loss-tail line at the last look (:meth:`hpo.stats.LossTail.line`)."""
    note: str | None = None
    order: list[str] = field(default_factory=list)
    """Configuration ids in the order they completed."""
    differences: list[float | None] = field(default_factory=list)
    """Their differences (None: no finite difference, replaced)."""
    recorded_decisions: list[str] = field(default_factory=list)
    """The decisions the sweep logged at its looks."""
    gpu_hours: float = math.nan
    """GPU-hours the family's trials spent, every precision and state (the verdict's cost)."""
    cpu_hours: float = math.nan
    """CPU-hours likewise."""
    trials: int = 0
    """Trials that recorded their cost."""


@dataclass
class PairSharpeTest:
    """The two trials of one seed pair on one split: is their Sharpe ratio different,
    on the bars both traded? (:func:`hpo.stats.sharpe_difference_test` of other vs
    reference; statistics > 0 when the other precision's Sharpe is higher.)"""

    n_bars: int
    """Common bars (inner join on timestamp and fold); 0 when not available."""
    difference: float = math.nan
    """Per-period Sharpe of the other precision's trial minus the reference's, on those
    bars."""
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
    not independent pairs. ``val`` / ``test`` are :func:`~hpo.stats.compare_paired` over those
    configuration means; the per-seed pairs stay listed in ``config_pairs``.
    """

    reference: str
    other: str
    config_ids: list[str]
    """Configurations passed to :func:`~hpo.stats.compare_paired`, in that order
    (``excluded_indices`` index it)."""
    config_pairs: dict[str, list[str]]
    """Configuration -> its seed pairs (pair ids), every one of them complete."""
    incomplete: dict[str, str]
    """Pairs not compared (yet): pair_id -> why (missing, unfinished or errored trial, or
    another seed of its configuration pending)."""
    val: PairedComparison
    test: PairedComparison
    inference: dict[str, SplitInference]
    """Split -> test method, BH adjustment and verdict."""
    pair_tests: dict[str, dict[str, PairSharpeTest]] = field(default_factory=dict)
    """Seed pair -> split -> Sharpe-difference tests of its two trials' return series
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
        """The verdict's text on ``split`` (:data:`VERDICT_SPLIT`'s by default); code decides
        from ``inference[split].decision`` instead."""
        return self.inference[split or VERDICT_SPLIT].verdict

    def excluded_config_ids(self, split: str = "val") -> list[str]:
        """Configurations left out of ``split``: a trial of one of their seeds diverged."""
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
    """Probability of backtest overfitting (CSCV,
    :func:`hpo.stats.probability_of_backtest_overfitting`): the share of
    in-sample/out-of-sample splits of the validation bars where the in-sample best trial
    ranks at or below the median out of sample."""
    pbo_n_blocks: int = 0
    """CSCV blocks used (:data:`~hpo.compare.inference.PBO_BLOCKS`, fewer on few common
    bars)."""
    pbo_n_bars: int = 0
    """Validation bars every completed trial has (the T of the PBO)."""
    pbo_note: str | None = None
    min_trl: float = math.nan
    """Minimum track record length (bars) of the best trial's validation Sharpe to beat 0 at
    :data:`~hpo.compare.inference.MIN_TRL_CONFIDENCE`, selection ignored; inf when that
    Sharpe is <= 0."""
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
    """Everything about one family, or all of them pooled (``overall``)."""

    scope: str
    families: list[str]
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
    sequential: SequentialRecord | None = None
    """A family of a sequential comparison: its looks and verdict (None otherwise)."""


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
        return [t for t in self.trials if scope in (OVERALL, t.family)]

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
    if isinstance(value, Verdict):
        return value.value
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    return value
