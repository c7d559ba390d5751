"""Inference per family: the statistics of :mod:`hpo.stats` applied to trial records.

:func:`compare_trials` turns trial records (already read, of the compared precisions only)
into a :class:`~hpo.compare.records.Comparison`, without MLflow:

* Trials are paired by ``(family, pair_id)``; every precision is compared with the first
  (the reference, normally f32): contrast ``bf16_vs_f32`` is ``bf16 - f32``. The unit of
  inference is the configuration (``config_id``): its seeds are averaged per precision.
* The verdict is a TOST equivalence test against ``margin`` (:data:`DEFAULT_MARGIN`), per
  family and overall, per split; :data:`~hpo.compare.records.VERDICT_SPLIT` is the
  headline. "worse"/"better" are Holm-adjusted over the families' one-sided claims of a
  contrast and split.
* A configuration enters when every trial of every seed pair is completed or diverged (a
  diverged trial makes it NaN: excluded and counted); the others are listed with the
  reason in ``Contrast.incomplete``. A bf16 trial that fell back to f32 counts as bf16.
  Nothing is dropped silently; configurations are ordered by ``(family, config_id)``.
* Return-based numbers (pair tests, PBO) read each record's ``returns``; without them they
  are "not available", with a note.

Every decision and its reason: docs/statistics.md
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

from cluster.tracking_auth import redact_uri
from hpo.compare.records import (
    ALL_PRECISIONS,
    OVERALL,
    Comparison,
    ComparisonError,
    Contrast,
    Overfitting,
    PairSharpeTest,
    ScopeComparison,
    Selection,
    SplitInference,
    TrialRecord,
    TrialReturns,
)
from hpo.compare.sequential import apply_sequential
from hpo.cost import summarise_cost
from hpo.stats import (
    EXACT_MAX_N,
    PAIRS_NEEDED_CAP,
    PairedComparison,
    Verdict,
    additional_pairs_needed,
    compare_paired,
    deflated_sharpe_ratio,
    equivalence_test,
    expected_max_sharpe,
    holm_adjust,
    min_track_record_length,
    probability_of_backtest_overfitting,
    sharpe_difference_test,
)
from trainables.returns_file import SPLITS

DEFAULT_MARGIN = 0.1
"""Equivalence margin, annualised Sharpe: bf16 counts as "as good" when the centre of the
paired differences is credibly within +-0.1 (the 90% Hodges-Lehmann interval inside it).
Why 0.1: it is a tenth of a Sharpe unit, a 10% change for a strategy with Sharpe 1, and
well below the sampling error of one Sharpe measurement (about sqrt((1 + SR^2 / 2) /
years), 1.2 for one year of daily bars), so a difference inside it is one no backtest of
that length could act on. Set it per sweep before looking at the results."""
EQUIVALENCE_ALPHA = 0.05
"""Level of each one-sided test of the TOST (its interval is the 90% Hodges-Lehmann one)."""
PBO_BLOCKS = 16
"""CSCV blocks of the PBO (Bailey et al. 2015's S): C(16, 8) = 12870 splits. With fewer
than 2 bars a block on the common bars, the largest even S that has them is used."""
MIN_TRL_CONFIDENCE = 0.95
"""Confidence at which the MinTRL of the best trial beats a zero Sharpe (the PSR's 0)."""
PAIR_TEST_MIN_BARS = 8
_TERMINAL: frozenset[str] = frozenset({"completed", "diverged"})
"""Trial states that are final for a pair: it compares once both its trials are."""


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
    sequential: Mapping[str, Mapping[str, Any]] | None = None,
) -> Comparison:
    """The comparison of ``trials`` (already read), reference precision first.

    The computation behind :func:`~hpo.compare.mlflow_reader.comparison_from_mlflow`,
    without MLflow: trials of other precisions must already be left out. ``sequential``:
    a sequential sweep's record per family (the parent run's
    :data:`~hpo.tracking.SEQUENTIAL_ARTIFACT`), whose looks decide those
    families' verdicts (:func:`~hpo.compare.sequential.apply_sequential`). The remaining
    arguments are recorded in the result as they are given (``tracking_uri`` without
    credentials).
    """
    if not (math.isfinite(margin) and margin > 0.0):
        raise ComparisonError(f"margin must be a finite Sharpe difference > 0, got {margin!r}")
    settings = _Settings(confidence, margin, {})
    chosen = list(precisions)
    records = sorted(
        trials, key=lambda t: (t.family, t.pair_id, chosen.index(t.precision), t.trial_id)
    )
    all_notes = list(notes)
    if not records:
        all_notes.append("no trial runs of the compared precisions yet")
    families = {
        family: _scope(family, [t for t in records if t.family == family], chosen, settings)
        for family in sorted({t.family for t in records})
    }
    overall = _scope(OVERALL, records, chosen, settings)
    _adjust_across_families(list(families.values()))
    for contrast in overall.contrasts.values():
        for split in SPLITS:
            _holm([contrast.inference[split]])
    if sequential:
        all_notes += apply_sequential(families, sequential)
        overall.notes.append(
            "a sequential comparison: each family stopped at its own look, so the pooled "
            "statistics are a fixed-design analysis of the configurations they took, "
            "descriptive; the families' verdicts are their looks'"
        )
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


class _Settings(NamedTuple):
    confidence: float
    margin: float
    pair_tests: dict[tuple[str, str, str], PairSharpeTest]
    """(reference run, other run, split) -> its test: a family's pairs again in overall."""


# Which of two runs of one trial the comparison keeps: the one that got furthest.
_STATE_RANK = {"error": 0, "unfinished": 1, "diverged": 2, "completed": 3}


def _scope(
    scope: str, trials: list[TrialRecord], precisions: list[str], settings: _Settings
) -> ScopeComparison:
    notes: list[str] = []
    counts = {p: _counts([t for t in trials if t.precision == p]) for p in precisions}
    reference = precisions[0]
    by_pair: dict[tuple[str, str], dict[str, TrialRecord]] = {}
    for t in trials:
        pair = by_pair.setdefault((t.family, t.pair_id), {})
        kept = pair.get(t.precision)
        if kept is not None:
            # Two runs of one trial: a sweep from before OOM retries continued their
            # trial's run left the failed attempt beside the retry. Trial ids are not
            # chronological, so keep the attempt that got furthest, not the first id.
            dropped = kept
            if _STATE_RANK[t.state] > _STATE_RANK[kept.state]:
                pair[t.precision] = kept = t
            else:
                dropped = t
            notes.append(
                f"pair {t.pair_id} has two {t.precision} trials "
                f"({kept.trial_id}, {dropped.trial_id}); kept {kept.trial_id} ({kept.state})"
            )
            continue
        pair[t.precision] = t
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
        families=sorted({t.family for t in trials}),
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
    # One point per configuration: its seeds and each seed pair's two trials are not
    # independent.
    by_config: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for t in completed:
        if math.isfinite(t.val_sharpe) and math.isfinite(t.test_sharpe):
            by_config.setdefault((t.family, t.config_id), []).append((t.val_sharpe, t.test_sharpe))
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
    for (family, pair_id), pair in sorted(by_pair.items()):
        a, b = pair.get(reference), pair.get(other)
        if a is None and b is None:
            continue  # a pair of other precisions only
        config = (family, (a or b).config_id)  # type: ignore[union-attr]
        reasons = [w for w in (_not_ready(p, pair.get(p)) for p in (reference, other)) if w]
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
        # Mean over the configuration's seeds; one diverged trial makes it NaN, and
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
    for trial in (reference, other):
        if trial.state != "completed":
            return PairSharpeTest(0, note=f"not available: {trial.trial_id} {trial.state}")
        if trial.returns is None:
            why = trial.returns_note or "returns not read"
            return PairSharpeTest(0, note=f"not available: {trial.trial_id}: {why}")
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
    other = kwargs["labels"][1]
    inference = SplitInference(wilcoxon_method=_wilcoxon_method(result), margin=margin, other=other)
    if diff.size == 0:
        inference.verdict_note = "no configuration with both precisions finite"
        return result, inference
    names = [c for c, ok in zip(config_ids, used, strict=True) if ok]
    _equivalence(diff, margin, other, inference, names)
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
    inference.tost_decision = tost.decision
    inference.pvalue_worse, inference.pvalue_better = tost.pvalue_worse, tost.pvalue_better
    inference.mean_tost_low, inference.mean_tost_high = (
        tost.mean_verdict_low,
        tost.mean_verdict_high,
    )
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
    if tost.note:
        notes.append(tost.note)
    if tost.loss_tail is not None:
        inference.tail_line = tost.loss_tail.line(other, names)
        notes.append(inference.tail_line)
    if inference.tail_configs:
        shown = ", ".join(f"{names[i]} ({diff[i]:+.3f})" for i in tost.tail[:5])
        more = f" and {len(tost.tail) - 5} more" if len(tost.tail) > 5 else ""
        notes.append(f"configurations in the tail (beyond 1.5 IQR): {shown}{more}")
    inference.verdict_note = "; ".join(notes) or None
    # Provisional; _holm sets the verdict from the adjusted directional p-values.
    inference.decision = tost.decision


def _holm(cells: list[SplitInference]) -> None:
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
        _decide(cell)


def _decide(inference: SplitInference) -> None:
    alpha = EQUIVALENCE_ALPHA
    raw = inference.tost_decision
    note = None
    if raw is Verdict.EQUIVALENT:
        decision = Verdict.EQUIVALENT
    elif inference.holm_p_worse <= alpha * (1.0 + 1e-12):
        decision = Verdict.WORSE
    elif inference.holm_p_better <= alpha * (1.0 + 1e-12):
        decision = Verdict.BETTER
    else:
        decision = Verdict.INCONCLUSIVE
        if raw is not Verdict.INCONCLUSIVE:
            # A directional claim lost to the adjustment: plan at the Bonferroni level.
            m = inference.holm_n_tests
            distance = abs(abs(inference.tost_estimate) - inference.margin)
            distance /= math.sqrt(math.pi / 3.0)  # the HL's efficiency
            needed, capped = additional_pairs_needed(
                inference.n_configs, inference.diff_sd, distance, alpha / m
            )
            inference.configs_needed, inference.configs_needed_capped = needed, capped
            holm = inference.holm_p_worse if raw is Verdict.WORSE else inference.holm_p_better
            lost = (
                f"{inference.tost_verdict} at 5% on its own, not after the Holm adjustment "
                f"over {m} one-sided claims (Holm p {holm:.3f})"
            )
            inference.verdict_note = "; ".join(n for n in (inference.verdict_note, lost) if n)
        if inference.configs_needed_capped:
            note = f"more than {PAIRS_NEEDED_CAP:,} more configurations needed"
        elif inference.configs_needed:
            n = inference.configs_needed
            noun = "configuration" if n == 1 else "configurations"
            note = f"about {n} more {noun} needed"
    if decision is not Verdict.INCONCLUSIVE:
        inference.configs_needed, inference.configs_needed_capped = 0, False
    inference.decision, inference.decision_note = decision, note


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
    n_configs = len({(t.family, t.config_id) for t in trials})
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
    """Benjamini-Hochberg and Holm across the families, per contrast and split.

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
            contrasts = [s.contrasts[key] for s in families if key in s.contrasts]
            _holm([c.inference[split] for c in contrasts])
