"""More work after a result: what each search stream may make, and what a result changes.

The :class:`~hpo.search.sweep_searcher.SweepSearcher` owns the streams (one per family in
compare mode, one per family and precision otherwise) and asks each stream's
:class:`StreamBudget` three things: how many configurations the stream may make now
(:meth:`~StreamBudget.allowance`), whether it will make any more
(:attr:`~StreamBudget.done`), and what changes once a configuration's every trial has
reported (:meth:`~StreamBudget.on_outcome`, which may end the stream and returns what to
tell the people watching). The searcher does the rest the same way for every policy:
round robin over the streams that may make something, asks of one shape, group
trials, OOM retries, withdrawing the queued work of a stream that ended, ``FINISHED``
once every stream is done and every trial reported, and the state in JSON.

Two policies now:

* :class:`FixedBudget`: ``samples`` configurations per stream, made as the searcher
  asks for them, whatever the results.
* :class:`SequentialBudget` (``[comparison] sequential = true``): a family gets
  configurations up to its next look, the stopping rule of :func:`hpo.stats.
  sequential_comparison` decides at each look over the per-configuration differences in
  the order the configurations completed, and a decided family gets nothing new.

Population-based training within one group trial needs none of its own (the population
is asked at once under a :class:`FixedBudget` and exploits inside its group trial);
populations larger than a group would plug in as a third (docs/search.md, "More work
after a result"). A budget's state is JSON inside the searcher's saved state: the looks it applied
and the ordered differences they read, so a resumed sweep repeats no look.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from hpo.spec import SweepSpec
from hpo.stopped_on import STOPPED_BUDGET, STOPPED_DECIDED, STOPPED_FAILURES, STOPPED_FUTILE

__all__ = [
    "FixedBudget",
    "Outcome",
    "PolicyEvent",
    "SequentialBudget",
    "StreamBudget",
    "TrialOutcome",
    "make_budgets",
]

DIFFERENCE_METRIC = "test_sharpe"
"""What a sequential comparison differences: the held-out test Sharpe, the comparison's
headline split (``hpo.compare.VERDICT_SPLIT``). No searcher sees it and no trial is
chosen by it, but it decides how many configurations a family gets (docs/statistics.md
says what that means for the pool ``hpo best`` chooses from)."""


@dataclass(frozen=True)
class TrialOutcome:
    """One trial of a configuration as it ended: its precision, seed and final metrics
    (None where the trial has no finite value: it diverged, failed or was withdrawn)."""

    precision: str
    seed: int
    metrics: Mapping[str, float | None]


@dataclass(frozen=True)
class Outcome:
    """A configuration whose every trial has reported."""

    config_id: str
    trials: tuple[TrialOutcome, ...]


@dataclass(frozen=True)
class PolicyEvent:
    """What a budget tells the people watching: a progress line, its stream's record
    (:meth:`StreamBudget.record`) as it stands after the event, and the look the event is
    about (a sequential family's, as in the record's ``looks``; None for other events)."""

    stream: str
    line: str
    record: dict[str, Any]
    look: dict[str, Any] | None = None


class StreamBudget(ABC):
    """One stream's policy. The searcher calls :meth:`made` for every configuration it
    makes, :meth:`on_outcome` once each configuration's every trial has reported, and
    :meth:`withdrawn` for a queued configuration it took back before any of its trials
    started (a stream that :attr:`ended`)."""

    kind: ClassVar[str]

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.made_ids: list[str] = []

    def made(self, config_id: str) -> None:
        self.made_ids.append(config_id)

    def withdrawn(self, config_id: str) -> None:
        self.made_ids.remove(config_id)

    @abstractmethod
    def allowance(self) -> int:
        """Configurations this stream may make now (0: none now, perhaps later)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """Whether this stream will make no more configurations."""

    @property
    def ended(self) -> bool:
        """Whether this stream stopped before its configurations all ran (a sequential
        family decided): those made and not started are not wanted any more. A stream
        that is :attr:`done` because it made all it will make has not ended: its queued
        configurations still run."""
        return False

    def on_outcome(self, outcome: Outcome) -> list[PolicyEvent]:
        """A configuration's every trial reported; returns what to tell (none by default)."""
        return []

    def record(self) -> dict[str, Any] | None:
        """What the team reads of this stream (the parent run's artifact), or None."""
        return None

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "made": list(self.made_ids)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"a {state.get('kind')!r} budget's state, expected {self.kind!r}")
        self.made_ids = list(state["made"])


class FixedBudget(StreamBudget):
    """``samples`` configurations, whatever the results (the design fixed in advance)."""

    kind = "fixed"

    def __init__(self, stream: str, samples: int) -> None:
        super().__init__(stream)
        self.samples = samples

    def allowance(self) -> int:
        return max(0, self.samples - len(self.made_ids))

    @property
    def done(self) -> bool:
        return len(self.made_ids) >= self.samples


@dataclass
class _Look:
    configs: int
    decision: str
    mean: float
    low: float | None
    high: float | None
    level: float


class SequentialBudget(StreamBudget):
    """A family of a sequential comparison: configurations up to its next look (at least
    ``in_flight`` running, never past its budget), decided by
    :func:`hpo.stats.sequential_comparison` at each look.

    The rule reads the per-configuration differences ``other - reference`` of the test
    Sharpe (seeds averaged, finite only) in the order the configurations completed. A
    configuration with no finite difference (a trial diverged or failed) does not count:
    the family makes another in its place until the next look's count is reached, and
    ends (:data:`STOPPED_FAILURES`) once as many have failed as its budget allows
    configurations, so a family whose trials all fail ends, saying so. Once decided (or
    futile, or out of budget) it makes nothing new; its configurations still queued are
    withdrawn by the searcher, and those already running finish and are recorded beside
    the looks, never read by them.

    The rule is deterministic given the planned looks and the ordered differences; both
    are the state, so a resumed sweep applies each look once.
    """

    kind = "sequential"

    def __init__(
        self,
        stream: str,
        plan: Sequence[int],
        margin: float,
        alpha: float,
        reference: str,
        other: str,
        directional_alpha: float | None = None,
        in_flight: int = 1,
    ) -> None:
        super().__init__(stream)
        self.plan = tuple(plan)
        """The looks: cumulative configurations (with a finite difference), the last the
        budget (:func:`hpo.stats.sequential_looks`)."""
        self.margin, self.alpha = margin, alpha
        self.directional_alpha = alpha if directional_alpha is None else directional_alpha
        """Error rate of a "worse" or "better" stop: the sweep's ``alpha / (2 x families)``
        (Bonferroni), so a family stopped on a claim keeps it after ``hpo compare``'s Holm
        adjustment over every family's two claims (a stop at ``alpha`` could end
        "inconclusive" there, with no configurations left to make)."""
        self.reference, self.other = reference, other
        self.in_flight = in_flight
        """Configurations of the family that may run at once between two looks (a sweep
        passes the spec's ``comparison.in_flight``; 1 here asks only up to the next look),
        whatever the looks' spacing; those still running when the family decides are
        recorded and never read."""
        self.slots: int | None = None
        """Configurations the sweep's slots run at once (``max_concurrent`` in
        configurations; None: not bounded), which a handed-on share never exceeds: where
        every slot is busy anyway, more in flight would only run past decisions."""
        self.siblings: Sequence[StreamBudget] = (self,)
        """Every family's budget of the sweep, this one among them (:func:`make_budgets`
        sets it): the slots of those decided go to those still deciding
        (:attr:`in_flight_now`)."""
        self.order: list[tuple[str, float | None]] = []
        """(config id, difference or None) in the order the configurations completed."""
        self.looks: list[_Look] = []
        self.decision = "continue"
        self.stopped_on: str | None = None
        self.note: str | None = None

    @property
    def budget(self) -> int:
        return self.plan[-1]

    @property
    def failure_cap(self) -> int:
        """Configurations without a finite difference after which the family ends: as many
        as its budget."""
        return self.budget

    @property
    def differences(self) -> list[float]:
        return [d for _, d in self.order if d is not None]

    @property
    def failed(self) -> int:
        return sum(d is None for _, d in self.order)

    @property
    def pending(self) -> int:
        """Configurations made whose trials have not all reported."""
        return len(self.made_ids) - len(self.order)

    def next_look(self) -> int:
        """Configurations (with a finite difference) at which the next look applies."""
        n = len(self.differences)
        return next((look for look in self.plan if look > n), self.budget)

    @property
    def in_flight_now(self) -> int:
        """Configurations of this family that may run at once now: ``in_flight``, with the
        share of the families already decided handed to those still deciding
        (``in_flight x families / undecided``, rounded up), so a decided family's slots
        are not left idle; never more than the undecided families' share of
        :attr:`slots` where the sweep bounds them (nor less than ``in_flight``)."""
        undecided = sum(not budget.done for budget in self.siblings) or 1
        share = -(-self.in_flight * len(self.siblings) // undecided)
        if self.slots is not None:
            share = min(share, max(self.in_flight, -(-self.slots // undecided)))
        return share

    def allowance(self) -> int:
        if self.done or self.failed >= self.failure_cap:
            return 0
        n = len(self.differences)
        wanted = min(max(self.next_look() - n, self.in_flight_now), self.budget - n)
        return max(0, wanted - self.pending)

    @property
    def done(self) -> bool:
        return self.stopped_on is not None

    @property
    def ended(self) -> bool:
        return self.done  # decided or given up: what is queued would not be read

    def on_outcome(self, outcome: Outcome) -> list[PolicyEvent]:
        self.order.append((outcome.config_id, self._difference(outcome)))
        events = []
        if not self.done:
            events = [self._event(look) for look in self._apply_looks()]
        if not self.done and self.failed >= self.failure_cap and self.pending == 0:
            self.stopped_on = STOPPED_FAILURES
            self.note = (
                f"{self.failed} of {len(self.order)} configurations left no finite "
                f"difference (a trial diverged or failed), as many as its budget of "
                f"{self.budget}: stopped without a decision"
            )
            events.append(PolicyEvent(self.stream, f"{self.stream}: {self.note}", self.record()))
        return events

    def _difference(self, outcome: Outcome) -> float | None:
        """Mean over seeds of the other precision's test Sharpe minus the mean of the
        reference's; None unless every trial has a finite one."""
        sides: dict[str, list[float]] = {self.reference: [], self.other: []}
        for trial in outcome.trials:
            value = trial.metrics.get(DIFFERENCE_METRIC)
            if value is None or not math.isfinite(value) or trial.precision not in sides:
                return None
            sides[trial.precision].append(float(value))
        if not sides[self.reference] or not sides[self.other]:
            return None
        mean = {p: sum(v) / len(v) for p, v in sides.items()}
        return mean[self.other] - mean[self.reference]

    def _apply_looks(self) -> list[_Look]:
        """Every planned look the differences reached and the state has not applied, in
        order, up to the first that ends the family."""
        from hpo.stats import Verdict, sequential_comparison

        differences = self.differences
        if len(differences) < self.plan[0] or len(self.looks) == len(self.plan):
            return []
        result = sequential_comparison(
            differences,
            self.plan,
            self.margin,
            self.alpha,
            other=self.other,
            directional_alpha=self.directional_alpha,
        )
        new = []
        for look in result.looks[len(self.looks) :]:
            applied = _Look(
                configs=look.configs,
                decision=look.decision.value,
                mean=look.mean,
                low=look.low if math.isfinite(look.low) else None,
                high=look.high if math.isfinite(look.high) else None,
                level=look.level,
            )
            self.looks.append(applied)
            new.append(applied)
        self.decision = result.decision.value
        if result.decision is not Verdict.CONTINUE:
            self.stopped_on = (
                STOPPED_DECIDED
                if result.decision in (Verdict.EQUIVALENT, Verdict.WORSE, Verdict.BETTER)
                else STOPPED_BUDGET
                if result.configs == self.budget
                else STOPPED_FUTILE
            )
            self.note = result.note
        return new

    def _event(self, look: _Look) -> PolicyEvent:
        from hpo.stats import MIN_FIRST_LOOK

        interval = (
            f"mean {look.mean:+.3f} [{look.low:+.3f}, {look.high:+.3f}] "
            f"({1 - 2 * look.level:.1%} interval)"
            if look.low is not None and look.high is not None
            else f"mean {look.mean:+.3f} (no interval before {MIN_FIRST_LOOK})"
        )
        line = (
            f"{self.stream}: look {len(self.looks)} at {look.configs} of up to "
            f"{self.budget} configurations, {self.other} - {self.reference} test Sharpe "
            f"{interval}, margin \u00b1{self.margin:g}: {look.decision}"
        )
        if self.done and look is self.looks[-1]:
            line += f" (stopped on {self.stopped_on})"
        return PolicyEvent(self.stream, line, self.record(), vars(look).copy())

    def record(self) -> dict[str, Any]:
        """The family's looks and the ordered differences they read, and what it stopped
        on: JSON, the parent run's ``sequential.json`` entry and ``hpo compare``'s input."""
        return {
            "family": self.stream,
            "reference": self.reference,
            "other": self.other,
            "metric": DIFFERENCE_METRIC,
            "margin": self.margin,
            "alpha": self.alpha,
            "directional_alpha": self.directional_alpha,
            "plan": list(self.plan),
            "budget": self.budget,
            "configs_made": len(self.made_ids),
            "order": [{"config_id": c, "difference": d} for c, d in self.order],
            "looks": [vars(look).copy() for look in self.looks],
            "decision": self.decision,
            "stopped_on": self.stopped_on,
            "note": self.note,
        }

    def state(self) -> dict[str, Any]:
        return {**super().state(), **self.record()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        if tuple(state["plan"]) != self.plan:
            raise ValueError(
                f"{self.stream}: saved looks {state['plan']} differ from the spec's {list(self.plan)}"
            )
        self.order = [(o["config_id"], o["difference"]) for o in state["order"]]
        self.looks = [_Look(**look) for look in state["looks"]]
        self.decision = state["decision"]
        self.stopped_on = state["stopped_on"]
        self.note = state["note"]


def make_budgets(spec: SweepSpec, streams: Sequence[str]) -> list[StreamBudget]:
    """A budget per stream (named ``streams``): sequential families where the spec says
    ``[comparison] sequential = true``, else ``samples`` each."""
    if not spec.sequential:
        return [FixedBudget(stream, spec.samples) for stream in streams]
    from hpo.stats import sequential_looks

    plan = sequential_looks(spec.samples, spec.look_every, spec.configs_per_family)
    from hpo.compare.inference import EQUIVALENCE_ALPHA  # the fixed design's, per claim

    reference, other = spec.precisions
    margin = spec.comparison.margin
    # Holm over every family's two one-sided claims in hpo compare: a stop at the
    # Bonferroni share of alpha passes it whatever the other families show.
    directional = EQUIVALENCE_ALPHA / (2 * len(streams))
    budgets = [
        SequentialBudget(
            stream,
            plan,
            margin,
            EQUIVALENCE_ALPHA,
            reference,
            other,
            directional,
            in_flight=spec.in_flight,
        )
        for stream in streams
    ]
    slots = None
    if spec.max_concurrent is not None:
        # In configurations, each Tune trial taken as one trial: a group trial holds more,
        # but a larger group is a larger job, not a slot left idle.
        slots = max(1, spec.max_concurrent // (len(spec.precisions) * len(spec.seeds)))
    for budget in budgets:
        budget.siblings, budget.slots = budgets, slots
    return list(budgets)
