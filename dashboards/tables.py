"""Plain-text formatting of a comparison: the numbers as the CLI table and the HTML report
show them, and the ``rich`` tables that ``hpo compare`` prints.

Presentation only: everything here reads a :class:`hpo.compare.Comparison` and computes
nothing; the statistics and the MLflow I/O stay in :mod:`hpo.compare`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from hpo.compare import SPLITS, Comparison
from hpo.stats import PairedComparison

__all__ = ["format_ci", "format_num", "format_p", "rich_tables"]


def format_p(value: float) -> str:
    if not math.isfinite(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def format_num(value: float, signed: bool = False) -> str:
    if not math.isfinite(value):
        return "—"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def format_ci(result: PairedComparison) -> str:
    diff = format_num(result.median_difference, signed=True)
    if not (math.isfinite(result.ci_low) and math.isfinite(result.ci_high)):
        return f"{diff} [—]"
    return f"{diff} [{result.ci_low:+.3f}, {result.ci_high:+.3f}]"


def rich_tables(comparison: Comparison) -> Iterable[Any]:
    """One ``rich`` table per scope (model families, then overall), for ``hpo compare``."""
    from rich import box
    from rich.table import Table

    ref = comparison.reference
    others = comparison.precisions[1:]
    single = len(others) == 1
    caption = (
        f"val: validation Sharpe (selection); test: held-out (reported); diff = other - {ref}\n"
        "excl.: pairs with a diverged member; pend.: pairs not finished; q: Wilcoxon p "
        "BH-adjusted across families; diverged, DSR best: ref/other"
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
            "pairs",
            "excl.",
            "pend.",
            f"median {ref}",
            f"median {others[0]}" if single else "median other",
            f"median diff [{comparison.confidence:.0%} BCa CI]",
            "Wilcoxon p (q)",
            "MWU p",
            "KS p",
            "fallbacks",
            "diverged",
            "DSR best",
        )
        for i, column in enumerate(columns):
            # The CI may fold on a narrow terminal; the short cells never do.
            table.add_column(column, justify="right" if i else "left", no_wrap=i != 6)
        for contrast in scope.contrasts.values():
            other = contrast.other
            for split in SPLITS:
                r = contrast.split(split)
                q = getattr(contrast, f"{split}_wilcoxon_p_bh")
                p_text = format_p(r.wilcoxon_pvalue)
                if math.isfinite(q):
                    p_text += f" ({format_p(q)})"
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
                    p_text,
                    format_p(r.mannwhitney_pvalue),
                    format_p(r.ks_pvalue),
                    str(scope.counts[other]["fell_back"]) if on_val else "",
                    f"{scope.counts[ref]['diverged']}/{scope.counts[other]['diverged']}"
                    if on_val
                    else "",
                    f"{format_num(scope.selection[ref].dsr)}/"
                    f"{format_num(scope.selection[other].dsr)}"
                    if on_val
                    else "",
                )
        yield table
