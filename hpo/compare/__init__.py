"""The paired precision comparison of a sweep, recomputed from MLflow alone.

    hpo compare --experiment NAME [--tracking-uri URI] [--json FILE] [--html FILE] [--log]

:func:`comparison_from_mlflow` reads the sweep's parent run and its child (trial) runs,
nothing else (no Ray state, no sweep directory), so it works on any sweep, finished or
not, from any machine that reaches the tracking store. :func:`log_comparison` writes the
result back onto the parent run (metrics ``cmp.*``, tags, the JSON + HTML report).

The package, one job a module:

* :mod:`~hpo.compare.records`: the result records (trial, contrast, scope, comparison) and
  their JSON.
* :mod:`~hpo.compare.mlflow_reader`: reading the sweep's runs and returns artifacts (a
  cache, a pool of threads where the reads wait on a server).
* :mod:`~hpo.compare.inference`: the statistics per family and pooled, and the verdicts
  (:func:`compare_trials`, no MLflow).
* :mod:`~hpo.compare.sequential`: a sequential comparison's families, their looks
  recomputed from the sweep's record and their verdicts (:func:`apply_sequential`).
* :mod:`~hpo.compare.plan`: what a compare sweep can decide, printed before it launches.
* :mod:`~hpo.compare.mlflow_writer`: the ``cmp.*`` metrics and tags and the artifacts on
  the parent run.

The names below are the public API; everything else stays in its module.

Every decision and its reason: docs/statistics.md
"""

from __future__ import annotations

from hpo.compare.inference import (
    DEFAULT_MARGIN,
    MIN_TRL_CONFIDENCE,
    PBO_BLOCKS,
    compare_trials,
)
from hpo.compare.mlflow_reader import comparison_from_mlflow
from hpo.compare.mlflow_writer import (
    NOT_COMPUTED,
    comparison_metrics,
    comparison_tags,
    log_comparison,
)
from hpo.compare.records import (
    ALL_PRECISIONS,
    OVERALL,
    VERDICT_SPLIT,
    Comparison,
    ComparisonError,
    Contrast,
    Overfitting,
    PairSharpeTest,
    ScopeComparison,
    Selection,
    SequentialLookRecord,
    SequentialRecord,
    SplitInference,
    TrialRecord,
    TrialReturns,
    TrialState,
    contrast_key,
)
from hpo.compare.sequential import apply_sequential
from hpo.stopped_on import STOPPED_ON
from hpo.tracking import MARGIN_PARAM, RETURNS_ARTIFACT
from trainables.returns_file import SPLITS

__all__ = [
    "ALL_PRECISIONS",
    "DEFAULT_MARGIN",
    "MARGIN_PARAM",
    "MIN_TRL_CONFIDENCE",
    "NOT_COMPUTED",
    "OVERALL",
    "PBO_BLOCKS",
    "RETURNS_ARTIFACT",
    "SPLITS",
    "STOPPED_ON",
    "VERDICT_SPLIT",
    "Comparison",
    "ComparisonError",
    "Contrast",
    "Overfitting",
    "PairSharpeTest",
    "ScopeComparison",
    "Selection",
    "SequentialLookRecord",
    "SequentialRecord",
    "SplitInference",
    "TrialRecord",
    "TrialReturns",
    "TrialState",
    "apply_sequential",
    "compare_trials",
    "comparison_from_mlflow",
    "comparison_metrics",
    "comparison_tags",
    "contrast_key",
    "log_comparison",
]
