"""The comparison report: one self-contained HTML file (inline CSS and SVG, no script).

    hpo compare --experiment NAME --html report.html     # recomputed from MLflow, any time

``hpo sweep --compare`` attaches it to the parent run as ``comparison/report.html``. It
makes no network request (a Content-Security-Policy ``default-src 'none'``), so it opens the
same anywhere, air-gapped included. Its reading notes are ``reading_notes.html`` beside it.

Stable hooks (``<scope>``: a family or ``overall``, reduced to ``[A-Za-z0-9_-]``):

* ``p#mlflow-link`` - the trials' deep link into MLflow's runs table (text, not a link);
* ``h1#verdict`` - the verdict, overall and per family; ``section#cost`` with
  ``table#cost-table`` - hours, shares, speed and memory per scope and precision, and the
  paired cost ratio; ``ul#verdicts`` - why, per family; ``ul#family-verdicts`` - per
  family the verdict, the configurations it rests on, what it cost (GPU- and CPU-hours)
  and the tail line, with a sequential family's looks;
* ``table#looks-<scope>`` - a sequential family's looks (configurations, mean, repeated
  interval and its level, Hodges-Lehmann beside it, the futility number, decision), with
  what it stopped on (``p#stopped-<scope>``);
* ``#summary-table`` - one row per scope, contrast and split;
* ``section#family-<scope>.family`` - everything about one scope;
* ``table#stats-<scope>.stats-table``, ``table#counts-<scope>``, ``table#selection-<scope>``
  - the paired statistics, trial states, PSR/DSR; ``table#describe-<scope>`` (in a
  ``details``) - the two distributions' medians, skewness and W, U, D, descriptive;
* ``table#seeds-<scope>-<contrast>`` - every seed pair behind the configuration means;
* ``table#pairtests-<scope>-<contrast>`` - per seed pair and split, the bootstrap pair test
  with its BH q, HAC, and JKM (descriptive) (families only);
* ``table#overfitting-<scope>`` - PBO, MinTRL of the best trial, val/test Spearman;
* ``svg#dist-<scope>-<contrast>-<val|test>.plot-dist`` / ``svg#diff-...`` (same suffix,
  ``.plot-diff``) - the configuration means' Sharpe distributions / paired differences;
* ``svg#curves-<scope>-<contrast>.plot-curves`` - validation Sharpe per epoch, per pair;
* ``svg#resources-<scope>.plot-bars`` (or ``p#resources-<scope>.not-recorded``) - peak
  memory and throughput per precision; ``section#reading-notes`` - how to read the numbers,
  with ``table#power-table``; bold (``.significant``) marks adjusted p-values only.
"""

from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path
from string import Template

from dashboards._svg import (
    PALETTE,
    bars_plot,
    curves_plot,
    distribution_plot,
    paired_difference_plot,
)
from dashboards.tables import (
    cost_headline,
    family_lines,
    format_ci,
    format_confidence,
    format_interval,
    format_mean_ci,
    format_num,
    format_p,
    verdict_headline,
    verdict_sentence,
    verdict_text,
)
from hpo.compare import (
    ALL_PRECISIONS,
    MIN_TRL_CONFIDENCE,
    OVERALL,
    PBO_BLOCKS,
    SPLITS,
    STOPPED_ON,
    VERDICT_SPLIT,
    Comparison,
    Contrast,
    ScopeComparison,
    SequentialRecord,
    TrialRecord,
)
from hpo.mlflow_links import mlflow_ui, trials_link
from hpo.stats import EQUIVALENCE_POWER, POWER_TABLE_SD_RATIOS, configs_for_equivalence

__all__ = ["MAX_CURVE_PANELS", "dom_id", "render_report", "write_report"]

MAX_CURVE_PANELS = 16
"""Pairs drawn in the training-curve overlays of one family (the rest are counted)."""
SPLIT_LABEL = {"val": "validation Sharpe (selection)", "test": "held-out test Sharpe (reported)"}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1280px; padding: 0 24px 48px; color: #1b1b1b; }
h1 { font-size: 22px; margin: 24px 0 4px; } h1 span { display: block; }
.title { font-size: 16px; margin: 4px 0; }
#verdicts li { margin: 2px 0; } h2 { font-size: 18px; margin: 32px 0 8px; }
h3 { font-size: 15px; margin: 20px 0 6px; }
.meta, .caption, .footer-note { color: #555; font-size: 12.5px; }
nav a { margin-right: 12px; }
.table-wrap { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 8px 0 12px; font-variant-numeric: tabular-nums;
        font-size: 12.5px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 5px; text-align: right; white-space: nowrap; }
/* Headers fold onto several lines, so a wide table fits 1280 px without a scrollbar. */
th, td.text { white-space: normal; } th { vertical-align: bottom; min-width: 3em; }
.cost-line { font-weight: 600; margin: 2px 0; }
code { overflow-wrap: anywhere; }
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
        # The first line is the answer; everything below is how it was reached.
        '<h1 id="verdict">'
        + "".join(f"<span>{escape(line)}</span>" for line in verdict_headline(c))
        + "</h1>",
        _cost(c),
        _verdicts(c),
        _list(family_lines(c), "family-verdicts"),
        f'<p class="title">Does precision change out-of-sample Sharpe? {escape(c.experiment)}</p>',
        '<p class="meta">',
        f"{n_trials} trials; precisions {escape(', '.join(c.precisions))} "
        f"(reference {escape(c.reference)}); MLflow experiment {escape(c.experiment)} "
        f"({escape(c.experiment_id)}), parent run {escape(str(c.parent_run_id))}, "
        f"tracking {escape(c.tracking_uri)}; computed {escape(c.computed_at)}; "
        "unit of inference: the sampled configuration (seeds averaged); equivalence margin "
        f"\u00b1{c.margin:.2f} annualised Sharpe; "
        f"Hodges-Lehmann estimates with exact signed-rank {c.confidence:.0%} CIs (the "
        "confidence each achieves is shown).",
        "</p>",
        _mlflow_link(c),
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


def _raw_p_cell(p: float, title: str = "", css: str = "") -> str:
    """An unadjusted p-value: shown, never bold (one of many tests); ``title`` names its
    method."""
    tip = f' title="{escape(title)}"' if title else ""
    return f'<td class="{" ".join(["raw-p", css]).strip()}"{tip}>{escape(format_p(p))}</td>'


def _adjusted_p_cell(p: float, css: str) -> str:
    """An adjusted p-value (BH q, Holm): the one to read, bold at or below 0.05."""
    classes = ["adjusted-p", css]
    if math.isfinite(p) and p <= 0.05:
        classes.append("significant")
    return f'<td class="{" ".join(classes)}">{escape(format_p(p))}</td>'


def _descriptive_cell(p: float) -> str:
    """A p-value that describes the two distributions (MWU, KS): never emphasised, it is
    not the test of the paired design."""
    return f'<td class="descriptive">{escape(format_p(p))}</td>'


def _mlflow_link(c: Comparison) -> str:
    """Where the trials are in MLflow's runs table, as text to copy: the report links to
    nothing outside itself."""
    if not (c.experiment_id and c.parent_run_id):
        return ""
    ui = mlflow_ui(c.tracking_uri)
    try:
        link = trials_link(ui.base, c.experiment_id, c.parent_run_id)
    except ValueError:  # an id MLflow would not have made
        return ""
    serve = f"serve the store with <code>{escape(ui.command)}</code>, then " if ui.command else ""
    return (
        f'<p id="mlflow-link" class="meta">The trials in MLflow (Model-training runs table, '
        f"best val_sharpe first): {serve}open <code>{escape(link)}</code></p>"
    )


def _cost(c: Comparison) -> str:
    """What each precision spent, per family, and what the move saves (paired by
    configuration): the second thing on the first screen, after the verdict."""
    rows = []
    for scope in c.scopes:
        for precision, spent in scope.cost.by_precision.items():
            ratio = scope.cost.ratios.get(precision)
            if ratio is None:
                vs = "reference"
            elif math.isfinite(ratio.hours_ratio):
                ci = (
                    f" [{ratio.ci_low:.2f}, {ratio.ci_high:.2f}]"
                    if math.isfinite(ratio.ci_low)
                    else ""
                )
                vs = f"{ratio.hours_ratio:.2f}x{ci} ({ratio.configs} configurations)"
            else:
                vs = "—"
            share = spent.gpu_fraction
            rows.append(
                f'<tr data-scope="{escape(scope.scope)}" data-precision="{escape(precision)}">'
                f"<td>{escape(scope.scope)}</td><td class='text'>{escape(precision)}</td>"
                f"<td>{spent.trials}</td><td class='gpu-hours'>{spent.gpu_hours:.3f}</td>"
                f"<td class='cpu-hours'>{spent.cpu_hours:.3f}</td>"
                f"<td>{f'{share:.3g}' if math.isfinite(share) else '—'}</td>"
                f"<td>{_small(spent.steps_per_s)}</td><td>{_small(spent.peak_mem_mb)}</td>"
                f"<td class='text ratio'>{escape(vs)}</td></tr>"
            )
    unit = "GPU-hours" if c.overall.cost.basis == "gpu" else "CPU-hours"
    head = (
        "<tr><th>scope</th><th class='text'>precision</th><th>trials</th><th>GPU-hours</th>"
        "<th>CPU-hours</th><th>GPU share (median)</th><th>steps/s (median)</th>"
        f"<th>peak MB (median)</th><th class='text'>{unit} vs {escape(c.reference)}, per "
        f"configuration [{c.confidence:.0%} CI]</th></tr>"
    )
    lines = [f'<p class="cost-line">{escape(line)}</p>' for line in cost_headline(c)]
    return (
        '<section id="cost"><h2>Cost per precision</h2>'
        + "".join(lines)
        + '<div class="table-wrap"><table id="cost-table" class="stats-table">'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
        '<p class="caption">Hours: every trial that reported, finished or not. The ratio: '
        "per configuration completed in both precisions (its seeds averaged), the geometric "
        "mean of other/reference with a t-interval on the log ratios. A trial's GPU time is "
        "its GPU share times the seconds of its epochs, on CUDA only.</p></section>"
    )


def _verdicts(c: Comparison) -> str:
    items = [
        verdict_sentence(scope.scope, contrast, sequential=scope.sequential)
        for scope in c.scopes
        for contrast in scope.contrasts.values()
    ]
    if not items:
        return ""
    body = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<ul id="verdicts">{body}</ul>'


def _summary(c: Comparison) -> str:
    rows = []
    for scope in c.scopes:
        pooled = scope.selection[ALL_PRECISIONS]
        for contrast in scope.contrasts.values():
            for split in SPLITS:
                r = contrast.split(split)
                inference = contrast.inference[split]
                rows.append(
                    f'<tr data-scope="{escape(scope.scope)}" data-contrast="{contrast.key}" '
                    f'data-split="{split}">'
                    f'<td><a href="#{dom_id("family", scope.scope)}">{escape(scope.scope)}</a>'
                    f'</td><td class="text">{escape(contrast.other)} - '
                    f'{escape(contrast.reference)}</td><td class="text">{split}</td>'
                    f"<td>{r.n_pairs_used}</td><td>{r.n_excluded_nonfinite}</td>"
                    f'<td>{len(contrast.incomplete)}</td><td class="ci">{format_ci(r)}</td>'
                    f'<td class="mean-diff">{format_mean_ci(r)}</td>'
                    f"{_raw_p_cell(r.wilcoxon_pvalue, inference.wilcoxon_method)}"
                    f"{_adjusted_p_cell(inference.wilcoxon_p_bh, 'bh-q')}"
                    f"{_adjusted_p_cell(inference.holm_p_worse, 'holm-worse')}"
                    f"{_adjusted_p_cell(inference.holm_p_better, 'holm-better')}"
                    f'<td class="text verdict">{escape(verdict_text(contrast, split))}</td>'
                    f"<td>{format_num(pooled.dsr) if split == 'val' else ''}</td></tr>"
                )
    head = (
        "<tr><th>scope</th><th class='text'>contrast</th><th class='text'>Sharpe</th>"
        "<th>configs used</th><th>excluded (diverged)</th><th>pending pairs</th>"
        f"<th>HL diff [{c.confidence:.0%} CI] achieved</th>"
        f"<th>mean diff [{c.confidence:.0%} t CI]</th>"
        "<th title='how it was computed: in the family table'>Wilcoxon p (raw)</th>"
        "<th>BH q (families, this split)</th>"
        "<th>Holm p, worse</th><th>Holm p, better</th>"
        f"<th class='text'>verdict (\u00b1{c.margin:.2f})</th>"
        "<th>DSR of best (all precisions)</th></tr>"
    )
    return (
        '<section id="summary"><h2>Summary</h2><div class="table-wrap">'
        '<table id="summary-table" class="stats-table summary-table">'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
        '<p class="caption">diff = other precision minus the reference, per sampled '
        "configuration (its seeds' pairs of trials that differ only in precision, averaged); "
        "val = validation Sharpe (used for selection), test = held-out test Sharpe "
        f"(reported, never optimized). The headline verdict is the {VERDICT_SPLIT} split's. "
        "Bold: adjusted p-values at or below 0.05 (BH q across the families; Holm over every "
        "family's one-sided worse/better claims of the split, which the verdict reads); raw "
        "p-values are never bold.</p></section>"
    )


def _reading_notes(c: Comparison) -> str:
    n_tests = sorted(
        {
            contrast.inference[split].bh_n_tests
            for scope in c.families.values()
            for contrast in scope.contrasts.values()
            for split in SPLITS
            if contrast.inference[split].bh_n_tests
        }
    )
    tests = " or ".join(str(n) for n in n_tests) if n_tests else "no"
    # The prose lives in reading_notes.html beside this file (a string.Template); the
    # template is wrapped for reading: one space between words and none between tags here.
    raw = Path(__file__).with_name("reading_notes.html").read_text(encoding="utf-8")
    template = Template(re.sub(r">\s+<", "><", " ".join(raw.split())))
    return template.substitute(
        ref=escape(c.reference),
        margin=f"{c.margin:.2f}",
        power_table=_power_table(),
        headline_split="held-out test" if VERDICT_SPLIT == "test" else "validation",
        max_unreachable_n=_max_unreachable_n(c.confidence),
        confidence=f"{c.confidence:.0%}",
        tests=tests,
        pbo_blocks=PBO_BLOCKS,
        min_trl_confidence=f"{MIN_TRL_CONFIDENCE:.0%}",
        overall=OVERALL,
    )


def _scope_section(c: Comparison, scope: ScopeComparison, colours: dict[str, str]) -> str:
    name = scope.scope
    trials = c.trials_of(name)
    parts = [
        f'<section id="{dom_id("family", name)}" class="family" data-family="{escape(name)}">',
        f"<h2>{escape(name)}</h2>",
    ]
    if name == OVERALL:
        parts.append(
            f'<p class="caption">All families pooled: {escape(", ".join(scope.families))}.</p>'
        )
    if scope.sequential is not None:
        verdict = "; ".join(verdict_text(contrast) for contrast in scope.contrasts.values())
        parts += ["<h3>Sequential looks</h3>", _looks_table(name, scope.sequential, verdict)]
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
    parts.append("<h3>Seed pairs behind each configuration</h3>")
    for contrast in scope.contrasts.values():
        parts.append(_seeds_table(name, contrast, trials))
    parts.append(_counts_table(c, scope))
    if name != OVERALL:
        parts.append("<h3>Training curves of paired trials</h3>")
        for contrast in scope.contrasts.values():
            parts.append(_curves(name, contrast, trials, colours))
        parts.append("<h3>Memory and throughput per precision</h3>")
        parts.append(_resources(c, scope, colours))
    if name != OVERALL:
        parts.append("<h3>Pair tests on the return series</h3>")
        for contrast in scope.contrasts.values():
            parts.append(_pair_tests_table(name, contrast))
    parts.append("<h3>Selection bias: PSR and deflated Sharpe of the best trial</h3>")
    parts.append(_selection_table(c, scope))
    parts.append("<h3>Overfitting: PBO, minimum track record, validation vs test</h3>")
    parts.append(_overfitting_table(scope))
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
    """The paired test per contrast and split, then (folded away, so that both fit 1280 px)
    the descriptive statistics of the two distributions."""
    head = (
        "<tr><th class='text'>contrast, Sharpe</th><th>configs used</th>"
        "<th title='configurations with a diverged trial (NaN Sharpe)'>excluded</th>"
        "<th title='seed pairs with a trial unfinished, errored or missing, or another "
        "seed of their configuration so'>pending pairs</th>"
        f"<th>HL estimate</th><th>HL {c.confidence:.0%} CI</th><th>achieved</th>"
        f"<th>mean diff [{c.confidence:.0%} t CI]</th>"
        "<th>Wilcoxon p (raw)</th><th class='text'>computed</th><th>BH q</th>"
        "<th>Holm p, worse</th><th>Holm p, better</th>"
        f"<th class='text'>verdict (\u00b1{c.margin:.2f})</th><th>TOST p</th></tr>"
    )
    detail_head = (
        f"<tr><th class='text'>contrast, Sharpe</th><th>median {escape(c.reference)}</th>"
        "<th>median other</th><th>median diff</th><th>skewness of the differences</th>"
        "<th title='the interval of the mean that the verdict reads: valid when the "
        "differences are skewed'>mean: 90% interval (t or BCa, the wider)</th>"
        "<th>Wilcoxon W</th><th>MWU U</th><th>MWU p (descriptive)</th><th>KS D</th>"
        "<th>KS p (descriptive)</th></tr>"
    )
    rows, details = [], []
    for contrast in scope.contrasts.values():
        for split in SPLITS:
            r = contrast.split(split)
            inference = contrast.inference[split]
            label = (
                f'<tr data-contrast="{contrast.key}" data-split="{split}">'
                f'<td class="text">{escape(contrast.other)} - {escape(contrast.reference)}, '
                f"{split}</td>"
            )
            rows.append(
                f'{label}<td class="n-pairs">{r.n_pairs_used}</td>'
                f'<td class="n-excluded">{r.n_excluded_nonfinite}</td>'
                f"<td>{len(contrast.incomplete)}</td>"
                f'<td class="hl-estimate">{format_num(r.hl_estimate, True)}</td>'
                f'<td class="ci">{format_interval(r.hl_low, r.hl_high)}</td>'
                f'<td class="ci-confidence">{format_confidence(r.hl_confidence)}</td>'
                f'<td class="mean-diff">{format_mean_ci(r)}</td>'
                f"{_raw_p_cell(r.wilcoxon_pvalue, inference.wilcoxon_method)}"
                f'<td class="text method">{escape(inference.wilcoxon_method)}</td>'
                f"{_adjusted_p_cell(inference.wilcoxon_p_bh, 'bh-q')}"
                f"{_adjusted_p_cell(inference.holm_p_worse, 'holm-worse')}"
                f"{_adjusted_p_cell(inference.holm_p_better, 'holm-better')}"
                f'<td class="text verdict">{escape(verdict_text(contrast, split))}</td>'
                f"<td>{escape(format_p(inference.equivalence_pvalue))}</td></tr>"
            )
            details.append(
                f"{label}<td>{format_num(r.median_a)}</td>"
                f"<td>{escape(contrast.other)} {format_num(r.median_b)}</td>"
                f'<td class="median-diff">{format_num(r.median_difference, True)}</td>'
                f'<td class="skewness">{format_num(inference.skewness, True)}</td>'
                '<td class="mean-verdict-interval">'
                f"{format_interval(inference.mean_tost_low, inference.mean_tost_high)}</td>"
                f"<td>{format_num(r.wilcoxon_statistic)}</td>"
                f"<td>{format_num(r.mannwhitney_statistic)}</td>"
                f"{_descriptive_cell(r.mannwhitney_pvalue)}"
                f"<td>{format_num(r.ks_statistic)}</td>{_descriptive_cell(r.ks_pvalue)}</tr>"
            )
    return (
        f'<div class="table-wrap"><table id="{dom_id("stats", scope.scope)}" '
        f'class="stats-table" data-scope="{escape(scope.scope)}"><thead>{head}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        "<details><summary>the two distributions (medians, skewness, W, U, D: descriptive)"
        f'</summary><div class="table-wrap"><table id="{dom_id("describe", scope.scope)}" '
        f'class="describe-table"><thead>{detail_head}</thead>'
        f"<tbody>{''.join(details)}</tbody></table></div></details>"
    )


def _used_configs(
    contrast: Contrast, split: str, trials: list[TrialRecord]
) -> list[tuple[str, float, float]]:
    """The configurations behind the statistics of ``split`` (compared, not excluded):
    ``(configuration, reference mean, other mean)`` over its seeds."""
    by_key = {(t.pair_id, t.precision): t for t in trials}
    excluded = set(contrast.split(split).excluded_indices)
    used = []
    for i, config_id in enumerate(contrast.config_ids):
        if i in excluded:
            continue
        seed_pairs = [
            (by_key.get((p, contrast.reference)), by_key.get((p, contrast.other)))
            for p in contrast.config_pairs[config_id]
        ]
        pairs = [(a, b) for a, b in seed_pairs if a is not None and b is not None]
        if len(pairs) < len(seed_pairs):
            continue
        a_mean = sum(_split_value(a, split) for a, _ in pairs) / len(pairs)
        b_mean = sum(_split_value(b, split) for _, b in pairs) / len(pairs)
        used.append((config_id, a_mean, b_mean))
    return used


def _distribution(
    scope: str, contrast: Contrast, split: str, trials: list[TrialRecord], colours: dict[str, str]
) -> str:
    # The same values as the statistics (configuration means of the used ones), so the
    # drawn medians are the table's medians; every trial is in the seed and counts tables.
    used = _used_configs(contrast, split, trials)
    groups = [
        (contrast.reference, [(config, a) for config, a, _ in used], colours[contrast.reference]),
        (contrast.other, [(config, b) for config, _, b in used], colours[contrast.other]),
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
    differences = [(config, b - a) for config, a, b in _used_configs(contrast, split, trials)]
    inference = contrast.inference[split]
    footer = (
        f"{result.n_pairs_used} configurations; {result.n_excluded_nonfinite} excluded "
        f"(diverged); {len(contrast.incomplete)} pending pairs; Wilcoxon p "
        f"{format_p(result.wilcoxon_pvalue)} ({inference.wilcoxon_method})"
    )
    return paired_difference_plot(
        dom_id("diff", scope, contrast.key, split),
        f"{scope}: {contrast.other} - {contrast.reference}, {SPLIT_LABEL[split]}",
        differences,
        result.hl_estimate,
        (result.hl_low, result.hl_high),
        f"paired difference in Sharpe ({contrast.other} - {contrast.reference}), per configuration",
        colour,
        footer,
        centre_label="Hodges-Lehmann estimate",
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
            # Dashed: a trial that did not finish normally in its own precision.
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


def _seeds_table(scope: str, contrast: Contrast, trials: list[TrialRecord]) -> str:
    """Every seed pair of the compared configurations, with the configuration's mean
    difference (the value the tests use) on its first row."""
    by_key = {(t.pair_id, t.precision): t for t in trials}
    ref, other = escape(contrast.reference), escape(contrast.other)
    head = (
        "<tr><th class='text'>configuration</th><th class='text'>seed pair</th>"
        + "".join(
            f"<th>{split} {ref}</th><th>{split} {other}</th><th>{split} diff</th>"
            f"<th>{split} configuration mean diff</th>"
            for split in SPLITS
        )
        + "</tr>"
    )
    excluded = {split: set(contrast.excluded_config_ids(split)) for split in SPLITS}
    rows = []
    for config_id in contrast.config_ids:
        pairs = contrast.config_pairs[config_id]
        diffs: dict[str, list[float]] = {split: [] for split in SPLITS}
        cells = []
        for pair in pairs:
            a, b = by_key.get((pair, contrast.reference)), by_key.get((pair, contrast.other))
            row = []
            for split in SPLITS:
                va = _split_value(a, split) if a else math.nan
                vb = _split_value(b, split) if b else math.nan
                diffs[split].append(vb - va)
                row.append((va, vb, vb - va))
            cells.append((pair, row))
        for i, (pair, row) in enumerate(cells):
            tds = []
            for (va, vb, d), split in zip(row, SPLITS, strict=True):
                mean = ""
                if i == 0:
                    mean = (
                        "excluded (diverged)"
                        if config_id in excluded[split]
                        else format_num(sum(diffs[split]) / len(diffs[split]), True)
                    )
                tds.append(
                    f"<td>{format_num(va)}</td><td>{format_num(vb)}</td>"
                    f"<td>{format_num(d, True)}</td><td class='unit-mean'>{mean}</td>"
                )
            first = (
                f'<td class="text">{escape(config_id)}</td>' if i == 0 else '<td class="text"></td>'
            )
            rows.append(
                f'<tr data-unit="{escape(config_id)}" data-pair="{escape(pair)}">{first}'
                f'<td class="text">{escape(pair)}</td>{"".join(tds)}</tr>'
            )
    return (
        f'<div class="table-wrap"><table id="{dom_id("seeds", scope, contrast.key)}" '
        f'class="seeds-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
        "</div>"
    )


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


def _pair_tests_table(scope: str, contrast: Contrast) -> str:
    """Per seed pair and split: the two trials' Sharpe ratios compared on the bars both
    traded (positive z: the other precision's Sharpe is higher)."""
    head = (
        "<tr><th class='text'>seed pair</th><th class='text'>split</th><th>bars</th>"
        f"<th>ΔSR per bar ({escape(contrast.other)} - {escape(contrast.reference)})</th>"
        "<th>HAC z</th><th>bootstrap p (the pair test, raw)</th>"
        "<th>BH q (pairs, this split)</th><th>block</th><th>HAC p (raw)</th>"
        "<th>JKM z (descriptive)</th><th>JKM p (descriptive)</th>"
        "<th class='text'>note</th></tr>"
    )
    rows = []
    for pair, by_split in contrast.pair_tests.items():
        for split in SPLITS:
            t = by_split[split]
            rows.append(
                f'<tr data-pair="{escape(pair)}" data-split="{split}">'
                f'<td class="text">{escape(pair)}</td><td class="text">{split}</td>'
                f"<td>{t.n_bars or '—'}</td><td>{_small(t.difference)}</td>"
                f"<td>{format_num(t.hac_statistic, True)}</td>"
                f"{_raw_p_cell(t.boot_pvalue, css='boot-p')}"
                f"{_adjusted_p_cell(t.boot_p_bh, 'boot-q')}"
                f"<td>{t.boot_block or '—'}</td>"
                f'<td class="hac-p">{format_p(t.hac_pvalue)}</td>'
                f'<td class="descriptive">{format_num(t.jkm_statistic, True)}</td>'
                f'<td class="jkm-p descriptive">{format_p(t.jkm_pvalue)}</td>'
                f'<td class="text">{escape(t.note or "")}</td></tr>'
            )
    if not rows:
        rows.append('<tr><td class="text" colspan="12">no compared pair yet</td></tr>')
    return (
        f'<div class="table-wrap"><table id="{dom_id("pairtests", scope, contrast.key)}" '
        f'class="pairtests-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
        "</table></div>"
    )


def _overfitting_table(scope: ScopeComparison) -> str:
    fit = scope.overfitting
    trl = f"{math.ceil(fit.min_trl)}" if math.isfinite(fit.min_trl) else "—"
    trl0 = f"{math.ceil(fit.min_trl_sr0)}" if math.isfinite(fit.min_trl_sr0) else "—"
    track = f"best trial {fit.min_trl_trial_id or '—'} has {fit.min_trl_n_obs} validation bars"
    rows = [
        ("PBO (CSCV)", format_num(fit.pbo), f"{fit.pbo_n_blocks} blocks of {fit.pbo_n_bars} "
         f"common validation bars, {fit.n_completed} completed trials" if fit.pbo_n_blocks
         else "", fit.pbo_note, "pbo"),
        ("MinTRL vs SR0 (selection-aware), bars", trl0, f"{track}; SR > SR0 = "
         f"{_small(fit.min_trl_sr0_benchmark)} per bar (the best of N unskilled trials) at "
         f"{MIN_TRL_CONFIDENCE:.0%}", fit.min_trl_sr0_note, "min-trl-sr0"),
        ("MinTRL vs 0, selection ignored, bars", trl, f"{track}; SR > 0 at "
         f"{MIN_TRL_CONFIDENCE:.0%}", fit.min_trl_note, "min-trl"),
        ("val/test Spearman", format_num(fit.val_test_spearman, True),
         f"{fit.spearman_n} configurations (trials averaged), p "
         f"{format_p(fit.val_test_spearman_pvalue)}"
         if math.isfinite(fit.val_test_spearman) else "", fit.spearman_note, "spearman"),
    ]  # fmt: skip
    body = "".join(
        f'<tr class="{css}"><td class="text">{label}</td><td class="value">{value}</td>'
        f'<td class="text">{escape(detail)}</td><td class="text">{escape(note or "")}</td></tr>'
        for label, value, detail, note, css in rows
    )
    return (
        f'<table id="{dom_id("overfitting", scope.scope)}" class="overfitting-table">'
        "<thead><tr><th class='text'>quantity</th><th>value</th><th class='text'>from</th>"
        f"<th class='text'>note</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _looks_table(scope: str, record: SequentialRecord, verdict: str) -> str:
    """A sequential family's looks, and what it stopped on and cost, after its ``verdict``
    (its contrast's, on the verdict's split)."""
    rows = "".join(
        f'<tr data-configs="{look.configs}"><td>{look.configs}</td>'
        f"<td>{format_num(look.mean, signed=True)}</td>"
        f'<td class="interval">{format_interval(look.low, look.high)}</td>'
        f"<td>{_small(look.level)}</td>"
        f"<td>{format_num(look.hl_estimate, signed=True)} "
        f"{format_interval(look.hl_low, look.hl_high)}</td>"
        f"<td>{_small(look.decision_probability)}</td>"
        f'<td class="text decision">{escape(look.decision.value)}</td></tr>'
        for look in record.looks
    )
    stopped = (
        f"stopped on {STOPPED_ON.get(record.stopped_on, record.stopped_on)}"
        if record.stopped_on
        else "still running"
    )
    line = (
        f"{verdict}: {record.configs} of up to {record.budget} configurations "
        f"(planned looks {', '.join(str(n) for n in record.plan)}; {record.configs_made} made, "
        f"replacements and those finished after the decision included); {stopped}; "
        f"{record.gpu_hours:.3f} GPU-hours, {record.cpu_hours:.3f} CPU-hours over "
        f"{record.trials} trials; repeated p-values worse {format_p(record.p_worse)} / better "
        f"{format_p(record.p_better)}, Holm {format_p(record.holm_p_worse)} / "
        f"{format_p(record.holm_p_better)} over {record.holm_n_tests} claims"
    )
    notes = [n for n in (record.tail, record.note) if n]
    return (
        f'<p id="{dom_id("stopped", scope)}" class="stopped">{escape(line)}</p>'
        f'<div class="table-wrap"><table id="{dom_id("looks", scope)}" class="looks-table">'
        "<thead><tr><th>configurations</th><th>mean diff</th><th>repeated interval</th>"
        "<th>one-sided level</th><th>HL [interval]</th><th>P(decision by budget)</th>"
        f"<th class='text'>decision</th></tr></thead><tbody>{rows}</tbody></table></div>"
        + _list(notes)
    )


def _power_table() -> str:
    """Configurations needed for 80% power to show equivalence, by sd(d) / margin."""
    rows = "".join(
        f"<tr><td>{ratio:g}</td><td>{EQUIVALENCE_POWER[ratio]}</td>"
        f"<td class='approx'>{configs_for_equivalence(ratio)}</td></tr>"
        for ratio in POWER_TABLE_SD_RATIOS
    )
    return (
        '<table id="power-table" class="power-table"><thead><tr><th>sd(diff) / margin</th>'
        "<th>configurations (simulated)</th><th>normal approximation</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _small(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else "—"


def _max_unreachable_n(confidence: float) -> int:
    """The largest number of configurations whose widest signed-rank interval, [min, max]
    with confidence 1 - 2^(1-n), still falls short of ``confidence``."""
    n = 1
    while 1.0 - 2.0 ** (1 - (n + 1)) < confidence:
        n += 1
    return n
