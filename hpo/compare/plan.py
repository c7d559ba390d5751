"""What a compare sweep can decide, before it launches: per family, the fewest
configurations at which any verdict is reachable, the configurations 80% power needs by
sd / margin (fixed design and sequential rule) and the sequential rule's expected number;
and a warning where the sweep cannot answer at all.

``hpo sweep SPEC --plan`` and the start of a compare sweep print :func:`comparison_plan_text`
(the sweep also logs it on the parent run as :data:`PLAN_ARTIFACT`). The numbers are
:func:`hpo.stats.comparison_plan`'s (simulated at alpha 0.05; docs/statistics.md).
"""

from __future__ import annotations

from hpo.spec import SweepSpec
from hpo.stats import (
    DEFAULT_LOOK_EVERY,
    MIN_FIRST_LOOK,
    POWER_TABLE_SD_RATIOS,
    ComparisonPlan,
    comparison_plan,
    min_configs_for_verdict,
    sequential_looks,
)

PLAN_ARTIFACT = "comparison_plan.txt"
"""Parent-run artifact: the plan a compare sweep launched with."""


def plan_warnings(spec: SweepSpec) -> list[str]:
    """Why ``spec``'s comparison can never reach a verdict, naming the fix; [] when it can."""
    if not spec.compare:
        return []
    if spec.sequential:
        return []  # a budget below its first deciding look is a spec error (hpo.spec)
    fewest = min_configs_for_verdict()
    if spec.samples >= fewest:
        return []
    return [
        f"warning: samples = {spec.samples} can never reach a verdict: a fixed-design "
        f"comparison needs at least {fewest} configurations per family (no one-sided "
        f"test at 5% rejects with fewer). Set samples >= {fewest}, or [comparison] "
        "sequential = true with max_configs, so that each family gets configurations "
        f"until it is decided (its first verdict at {min_configs_for_verdict(sequential=True)})"
    ]


def comparison_plan_text(spec: SweepSpec) -> str:
    """The plan of ``spec``'s comparison: the warnings, a row per family, and the power
    table by sd / margin (the sd of the differences is unknown before the sweep)."""
    plan = comparison_plan()
    lines = [*plan_warnings(spec)]
    lines.append(
        f"comparison plan ({spec.precisions[1]} vs {spec.precisions[0]}, margin "
        f"\u00b1{spec.comparison.margin:g} Sharpe, 5% per one-sided claim):"
    )
    design, fewest, power, expected = _family_plan(spec, plan)
    rows: list[tuple[str, ...]] = [
        ("family", "design", "fewest for a verdict", "80% power up to", "expected configs")
    ]
    rows += [(family, design, fewest, power, expected) for family in spec.families]
    lines += _columns(rows, left=5)
    table: list[tuple[str, ...]] = [
        (
            "sd / margin (sd of the per-configuration differences)",
            *(f"{r:g}" for r in POWER_TABLE_SD_RATIOS),
        )
    ]
    table.append(
        ("fixed design: configurations for 80% power", *(str(p.fixed_configs) for p in plan))
    )
    table.append(
        ("sequential rule: budget for 80% power", *(str(p.sequential_budget) for p in plan))
    )
    table.append(
        (
            "sequential rule: expected configurations",
            *(f"{p.sequential_expected:.1f}" for p in plan),
        )
    )
    lines += _columns(table, left=1)
    lines.append(
        f"  (sequential: looks from {MIN_FIRST_LOOK} every {DEFAULT_LOOK_EVERY} "
        "configuration(s) at a true difference of 0; its power column is the table's for "
        "other schedules, which need a little more)"
    )
    return "\n".join(lines)


def _family_plan(spec: SweepSpec, plan: tuple[ComparisonPlan, ...]) -> tuple[str, str, str, str]:
    """(design, fewest configurations for a verdict, the largest sd / margin with 80%
    power, expected configurations) of each family of ``spec``."""
    if spec.sequential:
        looks = sequential_looks(spec.samples, spec.look_every, spec.configs_per_family)
        shown = ", ".join(str(n) for n in looks[:3]) + (
            f", ..., {looks[-1]}" if len(looks) > 4 else f", {looks[-1]}" if len(looks) == 4 else ""
        )
        design = f"sequential, looks at {shown}"
        # The first look the rule applies at: the plan's first at or past MIN_FIRST_LOOK
        # (samples = 4, look_every = 2: looks 4, 6, 8, 10 decides first, not 9).
        fewest = next((n for n in looks if n >= MIN_FIRST_LOOK), looks[-1] + 1)
        powered = [p for p in plan if p.sequential_budget <= spec.configs_per_family]
        # The table is simulated for looks from MIN_FIRST_LOOK every DEFAULT_LOOK_EVERY; its
        # expected number is the rule's at the budget the table gives for 80% power at that
        # sd / margin, not this spec's budget: say which. Another schedule (a later first
        # deciding look, sparser looks) takes more, by an amount not simulated here.
        default_schedule = fewest == MIN_FIRST_LOOK and spec.look_every == DEFAULT_LOOK_EVERY
        if not default_schedule:
            expected = f"not simulated for looks from {fewest} every {spec.look_every}"
        elif powered:
            expected = (
                f"{powered[-1].sequential_expected:.1f} at sd/margin {powered[-1].sd_ratio:g} "
                f"(budget {powered[-1].sequential_budget})"
            )
        else:
            expected = f"up to {spec.configs_per_family}"
    else:
        design = f"fixed, {spec.samples} configurations"
        fewest = min_configs_for_verdict()
        powered = [p for p in plan if p.fixed_configs <= spec.samples]
        expected = str(spec.samples)
    reachable = spec.configs_per_family >= fewest
    power = f"sd/margin {powered[-1].sd_ratio:g}" if powered else "none of the table's"
    return design, str(fewest) if reachable else f"{fewest} (unreachable)", power, expected


def _columns(rows: list[tuple[str, ...]], left: int) -> list[str]:
    """``rows`` as lines of aligned columns: the first ``left`` left-aligned, the rest
    right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
