"""The families of a sequential comparison: their looks, recomputed from the sweep's
record, their verdicts after the Holm adjustment across families, and what each cost.

A sequential sweep (``[comparison] sequential = true``) logs each family's planned looks
and its per-configuration differences in the order the configurations completed on the
parent run (:data:`hpo.tracking.SEQUENTIAL_ARTIFACT`, written as the looks happen by
:class:`hpo.tracking.MlflowSweepCallback`). :func:`apply_sequential` recomputes each
family's :func:`hpo.stats.sequential_comparison` from them (the rule is deterministic, so
these are the looks the sweep applied), Holm-adjusts the repeated p-values of the
directional claims over every family (both directions each), and sets the family's
headline verdict (the :data:`~hpo.compare.records.VERDICT_SPLIT` split's) to the
sequential one. The fixed-design statistics of the same configurations stay beside it as
they are, descriptive: they ignore that the family was looked at before it stopped.

Every decision and its reason: docs/statistics.md, "Deciding in steps"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpo.compare.records import (
    VERDICT_SPLIT,
    ScopeComparison,
    SequentialLookRecord,
    SequentialRecord,
)
from hpo.stats import Verdict, holm_adjust, sequential_comparison
from hpo.stopped_on import STOPPED_FAILURES


def apply_sequential(
    families: Mapping[str, ScopeComparison], records: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Attach each family's :class:`SequentialRecord` (from ``records``, the artifact's
    ``families``) and set its verdict; returns notes for the comparison (a family in the
    record without trials, looks that differ from the ones the sweep logged)."""
    notes = []
    sequential = {}
    for family, raw in sorted(records.items()):
        scope = families.get(family)
        if scope is None:
            notes.append(f"sequential record of {family!r}, a family without trial runs")
            continue
        record = _record(raw, scope)
        recomputed = [look.decision.value for look in record.looks]
        if record.recorded_decisions != recomputed:
            notes.append(
                f"{family}: the looks recomputed ({recomputed}) "
                f"differ from those the sweep logged ({record.recorded_decisions})"
            )
        scope.sequential = sequential[family] = record
    _holm(list(sequential.values()))
    for family, record in sequential.items():
        decision, note = _verdict(record)
        for contrast in families[family].contrasts.values():
            inference = contrast.inference[VERDICT_SPLIT]
            inference.decision, inference.decision_note = decision, note
            inference.verdict_note = "; ".join(
                n
                for n in (
                    f"sequential: {inference.verdict} at {record.configs} configurations (looks "
                    f"{', '.join(str(look.configs) for look in record.looks) or 'none yet'}); "
                    f"the fixed-design TOST of all {inference.n_configs} finished "
                    f"configurations ({inference.tost_verdict}) is descriptive: it ignores "
                    "the looks",
                    inference.verdict_note,
                )
                if n
            )
    return notes


def _record(raw: Mapping[str, Any], scope: ScopeComparison) -> SequentialRecord:
    order = [str(o["config_id"]) for o in raw["order"]]
    differences = [o["difference"] for o in raw["order"]]
    finite = [(c, float(d)) for c, d in zip(order, differences, strict=True) if d is not None]
    plan = [int(n) for n in raw["plan"]]
    margin, alpha = float(raw["margin"]), float(raw["alpha"])
    result = sequential_comparison(
        [d for _, d in finite],
        plan,
        margin,
        alpha,
        other=str(raw["other"]),
        directional_alpha=float(raw["directional_alpha"]),
    )
    looks = [
        SequentialLookRecord(
            configs=look.configs,
            decision=look.decision,
            mean=look.mean,
            low=look.low,
            high=look.high,
            level=look.level,
            hl_estimate=look.hl_estimate,
            hl_low=look.hl_low,
            hl_high=look.hl_high,
            decision_probability=look.decision_probability,
        )
        for look in result.looks
    ]
    names = [c for c, _ in finite]
    tail = result.tail.line(str(raw["other"]), names) if result.tail is not None else None
    stopped_on = raw.get("stopped_on")
    note = result.note
    if stopped_on == STOPPED_FAILURES:
        note = "; ".join(n for n in (raw.get("note"), note) if n)
    costs = scope.cost.by_precision.values()
    return SequentialRecord(
        decision=result.decision,
        stopped_on=stopped_on,
        configs=result.configs,
        configs_made=int(raw["configs_made"]),
        budget=result.budget,
        plan=plan,
        margin=margin,
        alpha=alpha,
        metric=str(raw["metric"]),
        looks=looks,
        p_worse=result.p_worse,
        p_better=result.p_better,
        tail=tail,
        note=note,
        order=order,
        differences=differences,
        recorded_decisions=[str(look["decision"]) for look in raw["looks"]],
        gpu_hours=sum(c.gpu_hours for c in costs),
        cpu_hours=sum(c.cpu_hours for c in costs),
        trials=sum(c.trials for c in costs),
    )


def _holm(records: list[SequentialRecord]) -> None:
    """Holm over both directional repeated p-values of every sequential family."""
    if not records:
        return
    raw = [p for r in records for p in (r.p_worse, r.p_better)]
    adjusted = holm_adjust(raw)
    for i, record in enumerate(records):
        record.holm_p_worse = float(adjusted[2 * i])
        record.holm_p_better = float(adjusted[2 * i + 1])
        record.holm_n_tests = len(raw)


def _verdict(record: SequentialRecord) -> tuple[Verdict, str | None]:
    """The family's verdict, its decision and note: the rule's decision, its directional
    claims kept only where the Holm-adjusted repeated p-value is at or below alpha."""
    decision = record.decision
    alpha = record.alpha * (1.0 + 1e-12)
    at = f"{record.configs} of up to {record.budget} configurations"
    if decision is Verdict.EQUIVALENT:
        return Verdict.EQUIVALENT, None
    if decision in (Verdict.WORSE, Verdict.BETTER):
        holm = record.holm_p_worse if decision is Verdict.WORSE else record.holm_p_better
        if holm <= alpha:
            return decision, None
        return Verdict.INCONCLUSIVE, (
            f"{decision.value} at {at} on its own, not after the Holm adjustment over "
            f"{record.holm_n_tests} one-sided claims (Holm p {holm:.3f})"
        )
    if record.stopped_on == STOPPED_FAILURES:
        failed = sum(d is None for d in record.differences)
        return Verdict.INCONCLUSIVE, (
            f"stopped after {failed} configurations without a finite difference"
        )
    if decision is Verdict.FUTILE:
        return Verdict.FUTILE, f"no decision at {at}"
    return Verdict.CONTINUE, f"{record.configs} of up to {record.budget} configurations so far"
