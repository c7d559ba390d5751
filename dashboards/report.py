"""The comparison report: one self-contained HTML file (inline CSS and SVG, no script).

    hpo compare --experiment NAME --html report.html     # recomputed from MLflow, any time

(``hpo sweep --compare`` also attaches it to the sweep's parent run as
``comparison/report.html``.)

It makes no network request: every plot is inline SVG, and a Content-Security-Policy
(``default-src 'none'``) makes the browser refuse anything else, so it opens the same from
an MLflow artifact view, an e-mail attachment or an air-gapped machine.

Stable hooks for browser tests and for readers who link to a part (``<scope>`` is a model
family or ``overall``; names are reduced to ``[A-Za-z0-9_-]``):

* ``#summary-table`` - one row per scope, contrast and split;
* ``section#family-<scope>.family`` - everything about one scope;
* ``table#stats-<scope>.stats-table`` - the paired statistics;
* ``table#counts-<scope>``, ``table#selection-<scope>`` - trial states, PSR/DSR;
* ``svg#dist-<scope>-<contrast>-<val|test>.plot-dist`` - the two Sharpe distributions
  (the pairs the statistics use);
* ``svg#diff-<scope>-<contrast>-<val|test>.plot-diff`` - paired differences, zero line;
* ``svg#curves-<scope>-<contrast>.plot-curves`` - validation Sharpe per epoch, per pair;
* ``svg#resources-<scope>.plot-bars`` - peak memory and throughput per precision (or a
  ``p#resources-<scope>.not-recorded``);
* ``section#reading-notes`` - how to read the numbers.
"""

from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path

from dashboards._svg import (
    PALETTE,
    bars_plot,
    curves_plot,
    distribution_plot,
    paired_difference_plot,
)
from dashboards.tables import format_ci, format_num, format_p
from hpo.compare import (
    ALL_PRECISIONS,
    OVERALL,
    SPLITS,
    Comparison,
    Contrast,
    ScopeComparison,
    TrialRecord,
)

__all__ = ["MAX_CURVE_PANELS", "dom_id", "render_report", "write_report"]

MAX_CURVE_PANELS = 16
"""Pairs drawn in the training-curve overlays of one family (the rest are counted)."""
SPLIT_LABEL = {"val": "validation Sharpe (selection)", "test": "held-out test Sharpe (reported)"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1280px; padding: 0 24px 48px; color: #1b1b1b; }
h1 { font-size: 22px; margin: 24px 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
.meta, .caption, .footer-note { color: #555; font-size: 12.5px; }
nav a { margin-right: 12px; }
.table-wrap { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 8px 0 12px; font-variant-numeric: tabular-nums;
        font-size: 12.5px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 5px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
thead th { border-bottom: 2px solid #999; background: #f6f6f6; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
svg.plot { background: #fff; border: 1px solid #e3e3e3; max-width: 100%; height: auto; }
svg text { font-size: 11px; fill: #333; }
svg .plot-title { font-size: 12.5px; font-weight: 600; }
svg .axis { stroke: #666; } svg .grid { stroke: #eee; }
svg .footer, svg .empty, svg .bar-missing { fill: #666; }
section.family { border-top: 1px solid #ccc; }
.notes li { color: #444; font-size: 12.5px; }
.significant { font-weight: 700; }
#reading-notes { background: #f7f7f2; border: 1px solid #e4e4d8; padding: 4px 16px; }
.not-recorded { color: #777; font-style: italic; }
"""


def dom_id(*parts: str) -> str:
    """An id from names: ``dom_id("dist", "tft", "val") == "dist-tft-val"``."""
    return "-".join(re.sub(r"[^A-Za-z0-9_-]+", "_", p) for p in parts)


def _colours(comparison: Comparison) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(comparison.precisions)}


def render_report(comparison: Comparison) -> str:
    """The report of ``comparison`` as one HTML document (a string)."""
    c = comparison
    colours = _colours(c)
    n_trials = len(c.trials)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Precision comparison: {escape(c.experiment)}</title>",
        f"<style>{_CSS}</style></head><body>",
        '<header id="report-header">',
        f"<h1>Does precision change out-of-sample Sharpe? {escape(c.experiment)}</h1>",
        '<p class="meta">',
        f"{n_trials} trials; precisions {escape(', '.join(c.precisions))} "
        f"(reference {escape(c.reference)}); MLflow experiment {escape(c.experiment)} "
        f"({escape(c.experiment_id)}), parent run {escape(str(c.parent_run_id))}, "
        f"tracking {escape(c.tracking_uri)}; computed {escape(c.computed_at)}; "
        f"{c.confidence:.0%} BCa CI from {c.n_resamples} resamples (seed {c.seed}).",
        "</p>",
        _list(c.notes, "comparison-notes"),
        "</header>",
        '<nav id="toc">',
        *(f'<a href="#{dom_id("family", s.scope)}">{escape(s.scope)}</a>' for s in c.scopes),
        '<a href="#reading-notes">how to read this</a></nav>',
        _summary(c),
        _reading_notes(c),
    ]
    for scope in c.scopes:
        parts.append(_scope_section(c, scope, colours))
    parts.append(
        '<p class="footer-note">Generated by <code>hpo compare</code> from MLflow alone; '
        "recompute with <code>hpo compare --experiment "
        f"{escape(c.experiment)} --html FILE</code>.</p></body></html>"
    )
    return "\n".join(p for p in parts if p)


def write_report(comparison: Comparison, path: Path | str) -> Path:
    """Write :func:`render_report` to ``path`` (atomically) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_report(comparison), encoding="utf-8")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------
# Pieces


def _list(items: list[str], css_id: str | None = None) -> str:
    if not items:
        return ""
    ident = f' id="{css_id}"' if css_id else ""
    body = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<ul class="notes"{ident}>{body}</ul>'


def _p_cell(p: float) -> str:
    cls = ' class="significant"' if math.isfinite(p) and p < 0.05 else ""
    return f"<td{cls}>{format_p(p)}</td>"


def _summary(c: Comparison) -> str:
    rows = []
    for scope in c.scopes:
        pooled = scope.selection[ALL_PRECISIONS]
        for contrast in scope.contrasts.values():
            for split in SPLITS:
                r = contrast.split(split)
                rows.append(
                    f'<tr data-scope="{escape(scope.scope)}" data-contrast="{contrast.key}" '
                    f'data-split="{split}">'
                    f'<td><a href="#{dom_id("family", scope.scope)}">{escape(scope.scope)}</a>'
                    f'</td><td class="text">{escape(contrast.other)} - '
                    f'{escape(contrast.reference)}</td><td class="text">{split}</td>'
                    f"<td>{r.n_pairs_used}</td><td>{r.n_excluded_nonfinite}</td>"
                    f"<td>{len(contrast.incomplete)}</td><td>{format_ci(r)}</td>"
                    f"{_p_cell(r.wilcoxon_pvalue)}"
                    f"{_p_cell(getattr(contrast, f'{split}_wilcoxon_p_bh'))}"
                    f"<td>{format_num(pooled.dsr) if split == 'val' else ''}</td></tr>"
                )
    head = (
        "<tr><th>scope</th><th class='text'>contrast</th><th class='text'>Sharpe</th>"
        "<th>pairs used</th><th>excluded (diverged)</th><th>pending</th>"
        f"<th>median diff [{c.confidence:.0%} BCa CI]</th><th>Wilcoxon p</th>"
        "<th>BH q (families)</th><th>DSR of best (all precisions)</th></tr>"
    )
    return (
        '<section id="summary"><h2>Summary</h2>'
        '<table id="summary-table" class="stats-table summary-table">'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
        '<p class="caption">diff = other precision minus the reference, per pair of trials '
        "that differ only in precision; val = validation Sharpe (used for selection), test = "
        "held-out test Sharpe (reported, never optimized).</p></section>"
    )


def _reading_notes(c: Comparison) -> str:
    ref = escape(c.reference)
    items = [
        "<b>Paired design.</b> Each pair is one sampled configuration and seed trained once "
        f"per precision. The Wilcoxon signed-rank test asks whether the paired differences "
        f"(other - {ref}) are centred on zero. Its p-value is the probability of differences "
        "at least this one-sided if precision made no difference; it is <i>not</i> the "
        "probability that precision makes no difference.",
        "<b>Absence of evidence.</b> A large p-value from a handful of pairs says little: with "
        "5 non-zero differences the smallest possible two-sided p is 0.0625. Read the BCa "
        "confidence interval of the median difference instead: every difference inside it is "
        "compatible with the data. If it includes Sharpe differences you would care about, "
        "this run cannot rule them out; run more pairs.",
        "<b>Descriptive checks.</b> Mann-Whitney U and Kolmogorov-Smirnov compare the two "
        "distributions while ignoring the pairing; they are shown to describe the "
        "distributions, not as the test.",
        "<b>Many families.</b> With ten families and two splits, one p below 0.05 is what "
        "chance produces; the BH q column adjusts the Wilcoxon p-values across families "
        "(Benjamini-Hochberg false discovery rate).",
        "<b>Validation versus test.</b> Configurations were selected on validation Sharpe; the "
        "held-out test Sharpe was never used for selection. A precision effect that shows on "
        "validation but not on test is more likely noise or selection than precision.",
        "<b>Diverged and fallen-back trials.</b> A trial whose Sharpe is not finite (it "
        "diverged even after the bf16 to f32 fallback) is excluded from the statistics with "
        "its pair and counted: compare the diverged counts across precisions. Trials that "
        "fell back to f32 stay in, as the outcome of the bf16 policy (fallback included). "
        "Pending pairs (a member unfinished, errored or missing) are listed, not compared.",
        "<b>Selection bias.</b> PSR is the probability that a trial's true per-period Sharpe "
        "exceeds 0 given the length, skewness and kurtosis of its validation returns. The "
        "deflated Sharpe ratio (DSR) of the best trial asks the same against the Sharpe "
        "that the best of N unskilled trials reaches by luck, with N = every trial tried. "
        "Pair members and seeds of one configuration are correlated, so that N overstates "
        "the independent trials and the DSR is conservative; 'DSR by configs' uses the "
        "number of distinct configurations. A DSR below 0.95 means the best trial is not "
        "distinguishable from the luck of searching.",
        "<b>Memory and throughput.</b> peak_mem_mb is the CUDA allocator peak on a GPU but "
        "the process's peak resident memory on CPU, which includes the Python runtime; bf16 "
        "savings show on GPU runs. steps_per_s is the last epoch's training throughput.",
        f"<b>Overall.</b> The {OVERALL} scope pools the pairs of every family, treating them "
        "as exchangeable; a family with many pairs dominates it.",
    ]
    body = "".join(f"<li>{i}</li>" for i in items)
    return f'<section id="reading-notes"><h2>How to read this</h2><ul>{body}</ul></section>'


def _scope_section(c: Comparison, scope: ScopeComparison, colours: dict[str, str]) -> str:
    name = scope.scope
    trials = c.trials_of(name)
    parts = [
        f'<section id="{dom_id("family", name)}" class="family" data-family="{escape(name)}">',
        f"<h2>{escape(name)}</h2>",
    ]
    if name == OVERALL:
        parts.append(
            f'<p class="caption">All families pooled: {escape(", ".join(scope.models))}.</p>'
        )
    parts += [
        "<h3>Paired statistics</h3>",
        _stats_table(c, scope),
        "<h3>Sharpe distributions and paired differences</h3>",
        '<div class="plots">',
    ]
    for contrast in scope.contrasts.values():
        for split in SPLITS:
            parts.append(_distribution(name, contrast, split, trials, colours))
            parts.append(_diff_plot(name, contrast, split, trials, colours[contrast.other]))
    parts.append("</div>")
    parts.append(_counts_table(c, scope))
    if name != OVERALL:
        parts.append("<h3>Training curves of paired trials</h3>")
        for contrast in scope.contrasts.values():
            parts.append(_curves(name, contrast, trials, colours))
        parts.append("<h3>Memory and throughput per precision</h3>")
        parts.append(_resources(c, scope, colours))
    parts.append("<h3>Selection bias: PSR and deflated Sharpe of the best trial</h3>")
    parts.append(_selection_table(c, scope))
    notes = list(scope.notes)
    for contrast in scope.contrasts.values():
        for split in SPLITS:
            notes += [f"{contrast.key} {split}: {n}" for n in contrast.split(split).notes]
            excluded = contrast.excluded_pair_ids(split)
            if excluded:
                notes.append(f"{contrast.key} {split}: excluded pairs {', '.join(excluded)}")
        notes += [f"{contrast.key}: pending {p} ({why})" for p, why in contrast.incomplete.items()]
    if notes:
        parts.append(
            f"<details open><summary>Notes ({len(notes)})</summary>{_list(notes)}</details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _split_value(t: TrialRecord, split: str) -> float:
    return t.val_sharpe if split == "val" else t.test_sharpe


def _stats_table(c: Comparison, scope: ScopeComparison) -> str:
    head = (
        "<tr><th class='text'>contrast, Sharpe</th><th>pairs used</th>"
        "<th title='pairs with a diverged member (NaN Sharpe)'>excluded</th>"
        "<th title='pairs with a member unfinished, errored or missing'>pending</th>"
        f"<th>median {escape(c.reference)}</th><th>median other</th>"
        "<th>mean diff</th><th>median diff</th>"
        f"<th>{c.confidence:.0%} BCa CI</th><th>Wilcoxon W</th><th>Wilcoxon p</th>"
        "<th>BH q</th><th>MWU U</th><th>MWU p</th><th>KS D</th><th>KS p</th></tr>"
    )
    rows = []
    for contrast in scope.contrasts.values():
        for split in SPLITS:
            r = contrast.split(split)
            ci = (
                f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
                if math.isfinite(r.ci_low) and math.isfinite(r.ci_high)
                else "—"
            )
            rows.append(
                f'<tr data-contrast="{contrast.key}" data-split="{split}">'
                f'<td class="text">{escape(contrast.other)} - {escape(contrast.reference)}, '
                f'{split}</td><td class="n-pairs">{r.n_pairs_used}</td>'
                f'<td class="n-excluded">{r.n_excluded_nonfinite}</td>'
                f"<td>{len(contrast.incomplete)}</td>"
                f"<td>{format_num(r.median_a)}</td>"
                f"<td>{escape(contrast.other)} {format_num(r.median_b)}</td>"
                f"<td>{format_num(r.mean_difference, True)}</td>"
                f'<td class="median-diff">{format_num(r.median_difference, True)}</td>'
                f'<td class="ci">{ci}</td><td>{format_num(r.wilcoxon_statistic)}</td>'
                f"{_p_cell(r.wilcoxon_pvalue)}"
                f"{_p_cell(getattr(contrast, f'{split}_wilcoxon_p_bh'))}"
                f"<td>{format_num(r.mannwhitney_statistic)}</td>{_p_cell(r.mannwhitney_pvalue)}"
                f"<td>{format_num(r.ks_statistic)}</td>{_p_cell(r.ks_pvalue)}</tr>"
            )
    return (
        f'<div class="table-wrap"><table id="{dom_id("stats", scope.scope)}" '
        f'class="stats-table" data-scope="{escape(scope.scope)}"><thead>{head}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _used_pairs(
    contrast: Contrast, split: str, trials: list[TrialRecord]
) -> list[tuple[str, TrialRecord, TrialRecord]]:
    """The pairs behind the statistics of ``split``: compared, and not excluded."""
    by_key = {(t.pair_id, t.precision): t for t in trials}
    excluded = set(contrast.split(split).excluded_indices)
    used = []
    for i, pair in enumerate(contrast.pair_ids):
        a, b = by_key.get((pair, contrast.reference)), by_key.get((pair, contrast.other))
        if i not in excluded and a is not None and b is not None:
            used.append((pair, a, b))
    return used


def _distribution(
    scope: str, contrast: Contrast, split: str, trials: list[TrialRecord], colours: dict[str, str]
) -> str:
    # The same values as the statistics (used pairs only), so the drawn medians are the
    # table's medians; every other trial is in the counts table.
    used = _used_pairs(contrast, split, trials)
    groups = [
        (
            contrast.reference,
            [(pair, _split_value(a, split)) for pair, a, _ in used],
            colours[contrast.reference],
        ),
        (
            contrast.other,
            [(pair, _split_value(b, split)) for pair, _, b in used],
            colours[contrast.other],
        ),
    ]
    key = "" if len(colours) == 2 else f" ({contrast.other} vs {contrast.reference})"
    return distribution_plot(
        dom_id("dist", scope, contrast.key, split),
        f"{scope}: {SPLIT_LABEL[split]}{key}",
        groups,
        "Sharpe (annualised)",
    )


def _diff_plot(
    scope: str, contrast: Contrast, split: str, trials: list[TrialRecord], colour: str
) -> str:
    result = contrast.split(split)
    differences = [
        (pair, _split_value(b, split) - _split_value(a, split))
        for pair, a, b in _used_pairs(contrast, split, trials)
    ]
    footer = (
        f"{result.n_pairs_used} pairs; {result.n_excluded_nonfinite} excluded (diverged); "
        f"{len(contrast.incomplete)} pending; Wilcoxon p {format_p(result.wilcoxon_pvalue)}"
    )
    return paired_difference_plot(
        dom_id("diff", scope, contrast.key, split),
        f"{scope}: {contrast.other} - {contrast.reference}, {SPLIT_LABEL[split]}",
        differences,
        result.median_difference,
        (result.ci_low, result.ci_high),
        f"paired difference in Sharpe ({contrast.other} - {contrast.reference})",
        colour,
        footer,
    )


def _curves(
    scope: str, contrast: Contrast, trials: list[TrialRecord], colours: dict[str, str]
) -> str:
    by_key = {(t.pair_id, t.precision): t for t in trials}
    pairs = sorted({t.pair_id for t in trials})
    panels = []
    for pair in pairs:
        series = []
        for precision in (contrast.reference, contrast.other):
            t = by_key.get((pair, precision))
            if t is None or not t.val_curve:
                continue
            label = precision if t.state == "completed" else f"{precision} ({t.state})"
            if t.fell_back_to_f32:
                label = f"{precision} (fell back to f32)"
            # Dashed: a member that did not finish normally in its own precision.
            dashed = t.state != "completed" or t.fell_back_to_f32
            series.append((label, colours[precision], t.val_curve, dashed))
        if series:
            panels.append((pair, series))
    if not panels:
        return (
            f'<p id="{dom_id("curves", scope, contrast.key)}" class="not-recorded">'
            "No validation-Sharpe histories recorded yet.</p>"
        )
    shown = panels[:MAX_CURVE_PANELS]
    title = f"{scope}: validation Sharpe per epoch, {contrast.reference} vs {contrast.other}"
    if len(panels) > len(shown):
        title += f" (first {len(shown)} of {len(panels)} pairs)"
    return curves_plot(
        dom_id("curves", scope, contrast.key), title, shown, "validation Sharpe (annualised)"
    )


def _resources(c: Comparison, scope: ScopeComparison, colours: dict[str, str]) -> str:
    res = scope.resources
    recorded = any(
        math.isfinite(res[p][k]) for p in c.precisions for k in ("peak_mem_mb", "steps_per_s")
    )
    ident = dom_id("resources", scope.scope)
    if not recorded:
        return f'<p id="{ident}" class="not-recorded">No peak memory or throughput recorded.</p>'
    panels = [
        (
            "peak memory (MB, median)",
            [(p, res[p]["peak_mem_mb"], colours[p]) for p in c.precisions],
        ),
        (
            "steps/s (median)",
            [(p, res[p]["steps_per_s"], colours[p]) for p in c.precisions],
        ),
    ]
    return bars_plot(ident, f"{scope.scope}: memory and throughput per precision", panels)


def _counts_table(c: Comparison, scope: ScopeComparison) -> str:
    keys = ("trials", "completed", "diverged", "error", "unfinished", "fell_back")
    head = "".join(f"<th>{k.replace('_', ' ')}</th>" for k in keys)
    rows = "".join(
        f'<tr data-precision="{escape(p)}"><td>{escape(p)}</td>'
        + "".join(f'<td class="{k}">{scope.counts[p][k]}</td>' for k in keys)
        + "</tr>"
        for p in c.precisions
    )
    return (
        f'<table id="{dom_id("counts", scope.scope)}" class="counts-table">'
        f"<thead><tr><th>precision</th>{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


def _selection_table(c: Comparison, scope: ScopeComparison) -> str:
    head = (
        "<tr><th>precision</th><th>trials (N)</th><th>configs</th><th>usable</th>"
        "<th class='text'>best trial</th><th>best val Sharpe</th><th>per-period SR</th>"
        "<th>PSR (SR&gt;0)</th><th>SR variance</th><th>E[max SR | N]</th><th>DSR</th>"
        "<th>DSR by configs</th><th class='text'>note</th></tr>"
    )
    rows = []
    for key in [*c.precisions, ALL_PRECISIONS]:
        s = scope.selection[key]
        rows.append(
            f'<tr data-precision="{escape(key)}"><td>{escape(key)}</td><td>{s.n_trials}</td>'
            f"<td>{s.n_configs}</td><td>{s.n_candidates}</td>"
            f'<td class="text">{escape(s.best_trial_id or "—")}</td>'
            f"<td>{format_num(s.best_val_sharpe)}</td>"
            f"<td>{_small(s.best_sharpe_per_period)}</td><td>{format_num(s.best_psr)}</td>"
            f"<td>{_small(s.sr_variance)}</td><td>{_small(s.expected_max_sharpe)}</td>"
            f'<td class="dsr">{format_num(s.dsr)}</td><td>{format_num(s.dsr_by_configs)}</td>'
            f'<td class="text">{escape(s.note or "")}</td></tr>'
        )
    return (
        f'<div class="table-wrap"><table id="{dom_id("selection", scope.scope)}" '
        f'class="selection-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        "</table></div>"
    )


def _small(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "—"
