"""Why a sequential family's stream stopped: the values of a sequential record's
``stopped_on``. :mod:`hpo.search.budget` decides them as the sweep runs, and ``hpo
compare`` reads them back (:mod:`hpo.compare.records`, :mod:`hpo.compare.sequential`).

A module of its own that imports nothing: the sweep's searcher needs these names for every
sweep, and :mod:`hpo.compare` imports SciPy's statistics, half a second of a driver's
start that a sweep comparing nothing does not spend (bench/README.md, "A sweep's fixed
cost")."""

from __future__ import annotations

STOPPED_DECIDED = "decision"  # a look said equivalent, worse or better
STOPPED_FUTILE = "futility"  # a look before the budget predicted no decision by it
STOPPED_BUDGET = "budget"  # the budget's look decided nothing
STOPPED_FAILURES = "failures"  # as many configurations without a finite difference as its budget

STOPPED_ON = {
    STOPPED_DECIDED: "a decision",
    STOPPED_FUTILE: "futility (no decision predicted by the budget)",
    STOPPED_BUDGET: "its budget",
    STOPPED_FAILURES: "failed configurations",
}
"""What a family stopped on, in words (``SequentialRecord.stopped_on``)."""
