"""Plain-text formatting of a comparison: the numbers as the CLI table and the HTML report
show them, and the ``rich`` tables that ``hpo compare`` prints.

Presentation only: everything here reads a :class:`hpo.compare.Comparison` and computes
nothing; the statistics and the MLflow I/O stay in :mod:`hpo.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hpo.compare import (
    NOT_COMPUTED,
    SPLITS,
    STOPPED_ON,
    VERDICT_SPLIT,
    Comparison,
    Contrast,
    ScopeComparison,
    SequentialRecord,
    SplitInference,
)
from hpo.stats import PairedComparison, Verdict

__all__ = [
    "compact_table",
    "cost_cell",
    "cost_headline",
    "family_lines",
    "format_ci",
    "format_confidence",
    "format_interval",
    "format_looks",
    "format_mean_ci",
    "format_num",
    "format_p",
    "hours_text",
    "overfitting_text",
    "rich_tables",
    "verdict_headline",
    "verdict_sentence",
    "verdict_text",
]


def format_p(value: float) -> str:
    if not math.isfinite(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def format_num(value: float, signed: bool = False) -> str:
    if not math.isfinite(value):
        return "—"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def format_interval(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "[—]"
    return f"[{low:+.3f}, {high:+.3f}]"


def format_confidence(value: float) -> str:
    """An achieved confidence: ``96.9%`` (one decimal: the exact levels are discrete)."""
    return f"{value:.1%}" if math.isfinite(value) else "—"


def format_ci(result: PairedComparison) -> str:
    """Hodges-Lehmann estimate, its exact signed-rank CI and the confidence it achieves:
    ``+0.050 [-0.100, +0.200] 93.8%``."""
    estimate = format_num(result.hl_estimate, signed=True)
    interval = format_interval(result.hl_low, result.hl_high)
    if interval == "[—]":
        return f"{estimate} {interval}"
    return f"{estimate} {interval} {format_confidence(result.hl_confidence)}"


def verdict_text(contrast: Contrast, split: str = VERDICT_SPLIT) -> str:
    """The verdict of one contrast and split as the report and the CLI print it."""
    return contrast.inference[split].verdict or NOT_COMPUTED


def verdict_headline(comparison: Comparison) -> list[str]:
    """One line per contrast: the overall verdict, then each family's (the report's first
    line and the first line ``hpo compare`` prints)."""
    lines = []
    split = "held-out test" if VERDICT_SPLIT == "test" else "validation"
    for key in comparison.contrast_keys:
        overall = comparison.overall.contrasts.get(key)
        if overall is None:
            continue
        families = "; ".join(
            f"{s.scope} {verdict_text(s.contrasts[key])}"
            for s in comparison.families.values()
            if key in s.contrasts
        )
        lines.append(
            f"Verdict, {overall.other} vs {overall.reference} ({split} Sharpe, margin "
            f"\u00b1{comparison.margin:.2f}): {verdict_text(overall)}"
            + (f" (families: {families})" if len(comparison.families) > 1 else "")
        )
    return lines or ["Verdict: no contrast to compare yet"]


def format_mean_ci(result: PairedComparison) -> str:
    """The mean difference and its t-interval: ``+0.010 [-0.020, +0.040]``."""
    return (
        f"{format_num(result.mean_difference, signed=True)} "
        f"{format_interval(result.mean_low, result.mean_high)}"
    )


def _holm_text(inference: SplitInference, side: str) -> str:
    p = inference.holm_p_worse if side == "below" else inference.holm_p_better
    return f"Holm p {format_p(p)} over {inference.holm_n_tests} one-sided claims"


def verdict_sentence(
    scope: str,
    contrast: Contrast,
    split: str = VERDICT_SPLIT,
    sequential: SequentialRecord | None = None,
) -> str:
    """One sentence that explains the verdict of ``contrast`` in ``scope``; a family of a
    sequential comparison (``sequential``) explains its looks on the verdict's split."""
    if sequential is not None and split == VERDICT_SPLIT:
        return _sequential_sentence(scope, contrast, sequential)
    r = contrast.split(split)
    inference = contrast.inference[split]
    margin = f"\u00b1{inference.margin:.2f}"
    other = contrast.other
    n = f"{r.n_pairs_used} configuration{'s' if r.n_pairs_used != 1 else ''}"
    interval = (
        f"the {format_confidence(inference.tost_confidence)} Hodges-Lehmann interval of "
        f"{other} - {contrast.reference} over {n} is "
        f"{format_interval(inference.tost_low, inference.tost_high)}"
    )
    mean = (
        f"the mean difference {format_num(r.mean_difference, True)} has the 90% interval "
        f"(t or BCa, the wider) "
        f"{format_interval(inference.mean_tost_low, inference.mean_tost_high)}"
    )
    p = f"TOST p = {format_p(inference.equivalence_pvalue)}"
    decision, verdict = inference.decision, inference.verdict
    if decision is None:
        why = inference.verdict_note or inference.wilcoxon_method
        return f"{scope}: no verdict ({why})."
    if decision is Verdict.EQUIVALENT:
        return f"{scope}: equivalent: {interval} and {mean}, both inside the margin {margin} ({p})."
    if decision is Verdict.INCONCLUSIVE:
        tail = f"; {inference.verdict_note}" if inference.verdict_note else ""
        low, high, m = inference.tost_low, inference.tost_high, inference.margin
        if inference.equivalence_withheld:
            where = f"inside the margin {margin}"  # why it is withheld: the note
        elif -m < low and high < m:
            where = f"inside the margin {margin}, but too few configurations to say so"
        elif high < -m or low > m:
            side = "below" if high < -m else "above"
            if inference.tost_decision not in (None, Verdict.INCONCLUSIVE):
                where = f"wholly {side} the margin {margin}, but not beyond chance over all claims"
            else:
                where = f"wholly {side} the margin {margin}, but too few configurations to say so"
        else:
            where = f"which reaches beyond the margin {margin} without lying wholly outside it"
        return f"{scope}: {verdict}: {interval}, {where} ({p}{tail})."
    side = "below" if decision is Verdict.WORSE else "above"
    return (
        f"{scope}: {verdict}: {interval}, wholly {side} the margin {margin} "
        f"({p}; {_holm_text(inference, side)})."
    )


def _sequential_sentence(scope: str, contrast: Contrast, record: SequentialRecord) -> str:
    """The verdict of a family decided in steps: what its last look read, and why."""
    inference = contrast.inference[VERDICT_SPLIT]
    margin = f"\u00b1{record.margin:.2f}"
    diff = f"{contrast.other} - {contrast.reference} {_metric_label(record.metric)}"
    last = record.looks[-1] if record.looks else None
    if last is None:
        return f"{scope}: {inference.verdict}: no look yet (the first at {record.plan[0]})."
    interval = (
        f"at the look at {last.configs} configurations the mean difference "
        f"{format_num(last.mean, True)} ({diff}) has the {1 - 2 * last.level:.1%} repeated "
        f"confidence interval {format_interval(last.low, last.high)}"
        if math.isfinite(last.low)
        else f"{last.configs} configurations so far, before the first look that decides"
    )
    decision = inference.decision
    if decision is Verdict.EQUIVALENT:
        why = f"inside the margin {margin}"
    elif decision in (Verdict.WORSE, Verdict.BETTER):
        side = "below" if decision is Verdict.WORSE else "above"
        holm = record.holm_p_worse if decision is Verdict.WORSE else record.holm_p_better
        why = (
            f"wholly {side} the margin {margin} (Holm p {format_p(holm)} over "
            f"{record.holm_n_tests} one-sided claims)"
        )
    else:
        why = record.note or f"neither inside nor beyond the margin {margin}"
    stopped = (
        f"; stopped on {STOPPED_ON.get(record.stopped_on, record.stopped_on)}"
        if record.stopped_on
        else ""
    )
    return f"{scope}: {inference.verdict} (sequential): {interval}, {why}{stopped}."


def _metric_label(metric: str) -> str:
    return "test Sharpe" if metric == "test_sharpe" else metric


def format_looks(record: SequentialRecord) -> str:
    """The looks in one line: ``6 continue; 8 continue; 10 [-0.027, +0.027] equivalent``."""
    return "; ".join(
        f"{look.configs} {format_interval(look.low, look.high)} {look.decision}"
        if math.isfinite(look.low)
        else f"{look.configs} {look.decision}"
        for look in record.looks
    )


def hours_text(gpu_hours: float, cpu_hours: float) -> str:
    """``0.012 GPU-hours, 0.34 CPU-hours`` (three digits; a dash where not recorded)."""
    gpu = f"{gpu_hours:.3g}" if math.isfinite(gpu_hours) else "\u2014"
    cpu = f"{cpu_hours:.3g}" if math.isfinite(cpu_hours) else "\u2014"
    return f"{gpu} GPU-hours, {cpu} CPU-hours"


def family_lines(comparison: Comparison) -> list[str]:
    """Per family: its verdict, the configurations it rests on and what reaching it cost
    (every trial of the family, each precision and state), then a sequential family's
    looks, and the tail line (how often the other precision loses more than the margin)."""
    lines = []
    for scope in comparison.families.values():
        spent = scope.cost.by_precision.values()
        cost = hours_text(sum(c.gpu_hours for c in spent), sum(c.cpu_hours for c in spent))
        record = scope.sequential
        for contrast in scope.contrasts.values():
            inference = contrast.inference[VERDICT_SPLIT]
            verdict = inference.verdict or NOT_COMPUTED
            if record is not None:
                stopped = (
                    f", stopped on {STOPPED_ON.get(record.stopped_on, record.stopped_on)}"
                    if record.stopped_on
                    else ", running"
                )
                if inference.decision is Verdict.CONTINUE:
                    verdict = "undecided"  # its "continue: ..." says the same as the line
                lines.append(
                    f"{scope.scope}: {verdict} after {record.configs} of up to {record.budget} "
                    f"configurations ({record.configs_made} made{stopped}); cost {cost}"
                )
                lines.append(f"  looks: {format_looks(record) or 'none yet'}")
                tail = record.tail
            else:
                lines.append(
                    f"{scope.scope}: {verdict} with {inference.n_configs} configurations; "
                    f"cost {cost}"
                )
                tail = inference.tail_line
            if tail:
                lines.append(f"  {tail}")
    return lines


def overfitting_text(scope: ScopeComparison) -> str:
    """One line on how much of the scope's selection is luck: PBO, MinTRL, Spearman."""
    fit = scope.overfitting
    if math.isfinite(fit.pbo):
        pbo = f"PBO {fit.pbo:.2f} ({fit.pbo_n_blocks} blocks, {fit.pbo_n_bars} bars)"
    else:
        pbo = f"PBO {fit.pbo_note or 'not available'}"
    if math.isfinite(fit.min_trl_sr0):
        trl = (
            f"MinTRL vs SR0 {math.ceil(fit.min_trl_sr0)} bars (best trial's track: "
            f"{fit.min_trl_n_obs})"
        )
    else:
        trl = f"MinTRL vs SR0 {fit.min_trl_sr0_note or 'not available'}"
    if math.isfinite(fit.min_trl):
        trl += f", vs 0 (selection ignored) {math.ceil(fit.min_trl)}"
    if math.isfinite(fit.val_test_spearman):
        rho = f"val/test Spearman {fit.val_test_spearman:+.2f} ({fit.spearman_n} configurations)"
    else:
        rho = f"val/test Spearman {fit.spearman_note or 'not available'}"
    return f"{scope.scope}: {pbo}; {trl}; {rho}"


def cost_headline(comparison: Comparison) -> list[str]:
    """What each contrast costs against the reference, all families pooled (the line under
    the verdict), then why GPU figures are missing where they are."""
    cost = comparison.overall.cost
    lines = [f"Cost: {ratio.sentence()}" for ratio in cost.ratios.values()]
    return lines + [f"Cost: {note}" for note in cost.notes]


def cost_cell(scope: ScopeComparison, other: str) -> str:
    """``0.48x GPU-h`` [CI]: the scope's paired hours ratio of ``other``, in few columns."""
    ratio = scope.cost.ratios.get(other)
    if ratio is None or not math.isfinite(ratio.hours_ratio):
        return "—"
    return f"{ratio.hours_ratio:.2f}x {ratio.basis.upper()}-h"


def compact_table(comparison: Comparison) -> Any:
    """One row per family and contrast (then overall), on the verdict's split, in at most
    100 columns: what a terminal shows by default (``hpo compare --wide``: everything)."""
    from rich import box
    from rich.table import Table

    split = VERDICT_SPLIT
    table = Table(
        title=f"per family, {'held-out test' if split == 'test' else 'validation'} Sharpe",
        title_justify="left",
        caption=(
            f"HL: Hodges-Lehmann estimate of other - {comparison.reference} over configurations "
            f"(seeds averaged), [{comparison.confidence:.0%} CI]; mean: mean difference; cost: "
            "paired hours ratio; --wide or the report: p-values, validation, DSR"
        ),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    for i, column in enumerate(("family", "contrast", "configs", "HL [CI]", "mean", "verdict")):
        table.add_column(column, justify="left" if i in (0, 1, 5) else "right", no_wrap=i != 5)
    table.add_column("cost", justify="right", no_wrap=True)
    for scope in comparison.scopes:
        for contrast in scope.contrasts.values():
            r = contrast.split(split)
            table.add_row(
                scope.scope,
                f"{contrast.other} - {contrast.reference}",
                str(r.n_pairs_used),
                f"{format_num(r.hl_estimate, signed=True)} {format_interval(r.hl_low, r.hl_high)}",
                format_num(r.mean_difference, signed=True),
                verdict_text(contrast, split),
                cost_cell(scope, contrast.other),
            )
    return table


def rich_tables(comparison: Comparison, *, wide: bool = False) -> Iterable[Any]:
    """The verdict and cost headline, then the compact table (fits 100 columns), or with
    ``wide`` one full ``rich`` table per scope (families, then overall), for
    ``hpo compare``."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    for line in verdict_headline(comparison):
        yield Text(line, style="bold")
    for line in cost_headline(comparison):
        yield Text(line)
    for line in family_lines(comparison):
        yield Text(line)
    if not wide:
        yield compact_table(comparison)
        for scope in comparison.scopes:
            yield Text(overfitting_text(scope))
        return
    ref = comparison.reference
    others = comparison.precisions[1:]
    single = len(others) == 1
    caption = (
        f"val: validation Sharpe (selection); test: held-out (reported); diff = other - {ref}\n"
        "configs: sampled configurations, seeds averaged; HL: Hodges-Lehmann estimate, exact "
        "signed-rank CI and the confidence it achieves; excl.: configurations with a "
        "diverged trial; pend.: seed pairs not finished\n"
        "Wilcoxon p: exact/normal = how it was computed; q: BH-adjusted across the families "
        "of one split (one test per family); MWU, KS: descriptive, not the test\n"
        "mean: mean difference and its t-interval (the verdict reads the 90% interval, t or "
        "BCa, the wider); Holm w/b: the worse/better claims' "
        "p-values Holm-adjusted over every family's one-sided claims of the split\n"
        f"verdict: TOST against \u00b1{comparison.margin:.2f} annualised Sharpe, with the mean "
        "inside it too; diverged, DSR best: ref/other; cost: paired hours ratio other/ref"
    )
    for scope in comparison.scopes:
        n_trials = sum(c["trials"] for c in scope.counts.values())
        table = Table(
            title=f"{scope.scope}: {n_trials} trials",
            title_justify="left",
            caption=caption,
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            collapse_padding=True,
            pad_edge=False,
        )
        columns = (
            "Sharpe diff",
            "configs",
            "excl.",
            "pend.",
            f"median {ref}",
            f"median {others[0]}" if single else "median other",
            f"HL diff [{comparison.confidence:.0%} CI] achieved",
            f"mean [{comparison.confidence:.0%} CI]",
            "Wilcoxon p (q)",
            "Holm w/b",
            "MWU p (descr.)",
            "KS p (descr.)",
            "verdict",
            "fallbacks",
            "diverged",
            "DSR best",
            "cost",
        )
        for i, column in enumerate(columns):
            # The CI and the verdict may fold on a narrow terminal; short cells never do.
            table.add_column(column, justify="right" if i else "left", no_wrap=i not in (6, 7, 12))
        for contrast in scope.contrasts.values():
            other = contrast.other
            for split in SPLITS:
                r = contrast.split(split)
                inference = contrast.inference[split]
                p_text = f"{format_p(r.wilcoxon_pvalue)} {_short_method(inference.wilcoxon_method)}"
                if math.isfinite(inference.wilcoxon_p_bh):
                    p_text += f" ({format_p(inference.wilcoxon_p_bh)})"
                on_val = split == "val"
                median_b = format_num(r.median_b)
                table.add_row(
                    f"{other} - {ref} {split}",
                    str(r.n_pairs_used),
                    str(r.n_excluded_nonfinite),
                    str(len(contrast.incomplete)),
                    format_num(r.median_a),
                    median_b if single else f"{other} {median_b}",
                    format_ci(r),
                    format_mean_ci(r),
                    p_text.strip(),
                    f"{format_p(inference.holm_p_worse)}/{format_p(inference.holm_p_better)}",
                    format_p(r.mannwhitney_pvalue),
                    format_p(r.ks_pvalue),
                    verdict_text(contrast, split),
                    str(scope.counts[other]["fell_back"]) if on_val else "",
                    f"{scope.counts[ref]['diverged']}/{scope.counts[other]['diverged']}"
                    if on_val
                    else "",
                    f"{format_num(scope.selection[ref].dsr)}/"
                    f"{format_num(scope.selection[other].dsr)}"
                    if on_val
                    else "",
                    cost_cell(scope, other) if on_val else "",
                )
        yield table
        yield Text(overfitting_text(scope))


def _short_method(method: str) -> str:
    """``exact`` / ``normal`` for the narrow CLI cell; the report and JSON say it in full."""
    if method.startswith("exact"):
        return "exact"
    if method.startswith("normal"):
        return "normal"
    return ""
