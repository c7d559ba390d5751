"""Writing a comparison back onto the sweep's parent run in MLflow.

:func:`log_comparison` logs :func:`comparison_metrics` (``cmp.*`` metrics, step 0),
:func:`comparison_tags` (settings, best trials, verdicts) and the artifacts
``comparison/comparison.json`` (and ``comparison/report.html`` when the caller passes the
rendered report).

Contract: a metric is logged only where it is finite (a missing one means "not
computable", with the reason in the JSON's notes); a verdict that cannot be computed is
tagged :data:`NOT_COMPUTED`. Presentation is the caller's: this module does not import
``dashboards``.
"""

from __future__ import annotations

import math
import time

from hpo.compare.records import (
    ALL_PRECISIONS,
    OVERALL,
    VERDICT_SPLIT,
    Comparison,
    ComparisonError,
    contrast_key,
)
from trainables.returns_file import SPLITS

ARTIFACT_DIR = "comparison"
JSON_ARTIFACT = "comparison.json"
HTML_ARTIFACT = "report.html"


def comparison_metrics(comparison: Comparison) -> dict[str, float]:
    """The ``cmp.*`` metrics of the parent run (finite values only; a missing metric means
    "not computable", with the reason in the JSON artifact's notes).

    Names: ``cmp.<scope>.<other>_vs_<ref>.<val|test>.<stat>`` for the paired statistics
    (``n_configs``: configurations used, seeds averaged; ``n_seed_pairs``: the seed pairs in
    them; ``n_excluded``: configurations with a diverged trial; ``n_incomplete``: seed
    pairs not compared yet; ``ci_low`` / ``ci_high``: the Hodges-Lehmann interval, zeros
    included, at the achieved ``ci_confidence``; ``hl_nonzero_estimate``: zeros dropped;
    ``mean_ci_low`` / ``mean_ci_high``: the mean difference's t-interval; ``pvalue_worse``
    / ``pvalue_better`` and their ``holm_p_*``; ``mean_tost_*``, ``skewness``,
    ``diff_sd``), ``cmp.<scope>.<precision>.<count or selection stat>`` and
    ``cmp.<scope>.dsr_best`` / ``cmp.<scope>.n_trials`` for all precisions together;
    ``cmp.<scope>.pbo`` (with ``pbo_n_blocks``, ``pbo_n_bars``), ``cmp.<scope>.min_trl``
    (bars, vs 0) and ``min_trl_sr0`` (vs the DSR's SR0), ``cmp.<scope>.val_test_spearman``
    (:class:`~hpo.compare.records.Overfitting`); per seed pair of a family,
    ``cmp.<family>.<other>_vs_<ref>.<split>.<pair_id>.<jkm|hac>_<p|z>`` and ``boot_p`` /
    ``boot_p_bh`` (the Sharpe-difference tests of its two trials; ``boot_p_bh`` is the
    one to read); ``cmp.<scope>.<precision>.gpu_hours`` / ``cpu_hours`` and
    ``cmp.<scope>.<other>_vs_<ref>.cost.<stat>`` (:mod:`hpo.cost`). A family of a
    sequential comparison: ``cmp.<family>.configs`` (its decision's), ``configs_made``,
    ``looks``, ``gpu_hours`` / ``cpu_hours`` (all its trials: what the verdict cost),
    ``p_worse`` / ``p_better`` (repeated p-values) and ``holm_p_worse`` /
    ``holm_p_better``. The verdicts are tags (:func:`comparison_tags`).
    """
    out: dict[str, float] = {}
    for scope in comparison.scopes:
        prefix = f"cmp.{scope.scope}"
        for key, contrast in scope.contrasts.items():
            for split in SPLITS:
                r = contrast.split(split)
                inference = contrast.inference[split]
                excluded = set(contrast.excluded_config_ids(split))
                values = {
                    "n_configs": r.n_pairs_used,
                    "n_seed_pairs": sum(
                        len(pairs)
                        for u, pairs in contrast.config_pairs.items()
                        if u not in excluded
                    ),
                    "n_excluded": r.n_excluded_nonfinite,
                    "n_incomplete": len(contrast.incomplete),
                    f"median_{contrast.reference}": r.median_a,
                    f"median_{contrast.other}": r.median_b,
                    "median_diff": r.median_difference,
                    "mean_diff": r.mean_difference,
                    "mean_ci_low": r.mean_low,
                    "mean_ci_high": r.mean_high,
                    "hl_estimate": r.hl_estimate,
                    "ci_low": r.hl_low,
                    "ci_high": r.hl_high,
                    "ci_confidence": r.hl_confidence,
                    "hl_nonzero_estimate": r.hl_nonzero_estimate,
                    "wilcoxon_p": r.wilcoxon_pvalue,
                    "wilcoxon_p_bh": inference.wilcoxon_p_bh,
                    "equivalence_p": inference.equivalence_pvalue,
                    "tost_low": inference.tost_low,
                    "tost_high": inference.tost_high,
                    "mean_tost_low": inference.mean_tost_low,
                    "mean_tost_high": inference.mean_tost_high,
                    "pvalue_worse": inference.pvalue_worse,
                    "pvalue_better": inference.pvalue_better,
                    "holm_p_worse": inference.holm_p_worse,
                    "holm_p_better": inference.holm_p_better,
                    "skewness": inference.skewness,
                    "diff_sd": inference.diff_sd,
                    "mannwhitney_p": r.mannwhitney_pvalue,
                    "ks_p": r.ks_pvalue,
                }
                for stat, value in values.items():
                    out[f"{prefix}.{key}.{split}.{stat}"] = float(value)
        for precision, counts in scope.counts.items():
            for name, value in counts.items():
                out[f"{prefix}.{precision}.n_{name}"] = float(value)
            sel = scope.selection[precision]
            out[f"{prefix}.{precision}.dsr_best"] = sel.dsr
            out[f"{prefix}.{precision}.psr_best"] = sel.best_psr
            out[f"{prefix}.{precision}.best_val_sharpe"] = sel.best_val_sharpe
            res = scope.resources[precision]
            out[f"{prefix}.{precision}.peak_mem_mb"] = res["peak_mem_mb"]
            out[f"{prefix}.{precision}.steps_per_s"] = res["steps_per_s"]
            spent = scope.cost.by_precision[precision]
            out[f"{prefix}.{precision}.gpu_hours"] = spent.gpu_hours
            out[f"{prefix}.{precision}.cpu_hours"] = spent.cpu_hours
        for other, ratio in scope.cost.ratios.items():
            name = f"{prefix}.{contrast_key(other, comparison.reference)}.cost"
            out[f"{name}.{ratio.basis}_hours_ratio"] = ratio.hours_ratio
            out[f"{name}.{ratio.basis}_hours_ratio_ci_low"] = ratio.ci_low
            out[f"{name}.{ratio.basis}_hours_ratio_ci_high"] = ratio.ci_high
            out[f"{name}.n_configs"] = float(ratio.configs) if ratio.configs else math.nan
            out[f"{name}.trials_per_gpu_ratio"] = ratio.trials_per_gpu
            out[f"{name}.step_speedup"] = ratio.step_speedup
            out[f"{name}.peak_mem_ratio"] = ratio.memory_ratio
        if scope.sequential is not None:
            record = scope.sequential
            out[f"{prefix}.configs"] = float(record.configs)
            out[f"{prefix}.configs_made"] = float(record.configs_made)
            out[f"{prefix}.looks"] = float(len(record.looks))
            out[f"{prefix}.gpu_hours"] = record.gpu_hours
            out[f"{prefix}.cpu_hours"] = record.cpu_hours
            out[f"{prefix}.p_worse"] = record.p_worse
            out[f"{prefix}.p_better"] = record.p_better
            out[f"{prefix}.holm_p_worse"] = record.holm_p_worse
            out[f"{prefix}.holm_p_better"] = record.holm_p_better
        pooled = scope.selection[ALL_PRECISIONS]
        out[f"{prefix}.dsr_best"] = pooled.dsr
        out[f"{prefix}.dsr_best_by_configs"] = pooled.dsr_by_configs
        out[f"{prefix}.n_trials"] = float(pooled.n_trials)
        fit = scope.overfitting
        out[f"{prefix}.pbo"] = fit.pbo
        out[f"{prefix}.pbo_n_blocks"] = float(fit.pbo_n_blocks) if fit.pbo_n_blocks else math.nan
        out[f"{prefix}.pbo_n_bars"] = float(fit.pbo_n_bars) if fit.pbo_n_blocks else math.nan
        out[f"{prefix}.min_trl"] = fit.min_trl
        out[f"{prefix}.min_trl_sr0"] = fit.min_trl_sr0
        out[f"{prefix}.val_test_spearman"] = fit.val_test_spearman
        if scope.scope == OVERALL:
            continue  # the families' pair tests, again
        for key, contrast in scope.contrasts.items():
            for pair_id, by_split in contrast.pair_tests.items():
                for split, test in by_split.items():
                    name = f"{prefix}.{key}.{split}.{pair_id}"
                    out[f"{name}.jkm_p"] = test.jkm_pvalue
                    out[f"{name}.hac_p"] = test.hac_pvalue
                    out[f"{name}.jkm_z"] = test.jkm_statistic
                    out[f"{name}.hac_z"] = test.hac_statistic
                    out[f"{name}.boot_p"] = test.boot_pvalue
                    out[f"{name}.boot_p_bh"] = test.boot_p_bh
    return {k: v for k, v in out.items() if math.isfinite(v)}


NOT_COMPUTED = "not computed"
"""Verdict tag value while a verdict cannot be computed (the JSON's ``decision`` is null,
its ``verdict_note`` says why)."""


def comparison_tags(comparison: Comparison) -> dict[str, str]:
    """The ``cmp.*`` tags of the parent run: settings, best trials and verdicts.

    Verdicts: ``cmp.<scope>.<other>_vs_<ref>.verdict`` (the :data:`VERDICT_SPLIT` split),
    ``cmp.<scope>.<other>_vs_<ref>.<val|test>.verdict`` and ``...wilcoxon_method`` per
    split, and ``cmp.<scope>.verdict``: the one contrast's verdict, or
    ``<key>: <verdict>; ...`` with several; ``cmp.<scope>.<other>_vs_<ref>.cost``: the
    cost sentence (:meth:`hpo.cost.CostRatio.sentence`). A family of a sequential
    comparison: ``cmp.<family>.decision`` (the rule's), ``cmp.<family>.stopped_on``
    (``running`` while it runs) and ``cmp.<family>.look_decisions`` (``configs decision``
    per look).
    """
    tags = {
        "cmp.reference": comparison.reference,
        "cmp.precisions": ",".join(comparison.precisions),
        "cmp.computed_at": comparison.computed_at,
        "cmp.confidence": str(comparison.confidence),
        "cmp.selection_metric": "val_sharpe",
        "cmp.margin": str(comparison.margin),
        "cmp.verdict_split": VERDICT_SPLIT,
        "cmp.unit": "configuration (seeds averaged)",
    }
    for scope in comparison.scopes:
        prefix = f"cmp.{scope.scope}"
        best = scope.selection[ALL_PRECISIONS].best_trial_id
        if best:
            tags[f"{prefix}.best_trial"] = best
        headline = []
        for key, contrast in scope.contrasts.items():
            for split in SPLITS:
                inference = contrast.inference[split]
                tags[f"{prefix}.{key}.{split}.verdict"] = inference.verdict or NOT_COMPUTED
                tags[f"{prefix}.{key}.{split}.wilcoxon_method"] = inference.wilcoxon_method
            verdict = contrast.verdict() or NOT_COMPUTED
            tags[f"{prefix}.{key}.verdict"] = verdict
            headline.append((key, verdict))
            if contrast.other in scope.cost.ratios:
                tags[f"{prefix}.{key}.cost"] = scope.cost.ratios[contrast.other].sentence()
        if scope.sequential is not None:
            record = scope.sequential
            tags[f"{prefix}.decision"] = record.decision.value
            tags[f"{prefix}.stopped_on"] = record.stopped_on or "running"
            tags[f"{prefix}.look_decisions"] = "; ".join(
                f"{look.configs} {look.decision.value}" for look in record.looks
            )
        if len(headline) == 1:
            tags[f"{prefix}.verdict"] = headline[0][1]
        elif headline:
            tags[f"{prefix}.verdict"] = "; ".join(f"{k}: {v}" for k, v in headline)
    return tags


def log_comparison(
    comparison: Comparison,
    tracking_uri: str,
    parent_run_id: str | None = None,
    *,
    report_html: str | None = None,
) -> dict[str, float]:
    """Write the comparison onto the sweep's parent run; returns the metrics logged.

    Statistics go in as metrics (:func:`comparison_metrics`, step 0, so the newest
    computation is the one the MLflow UI shows); the settings go in as tags, not params,
    because MLflow params are immutable and a running sweep is compared again as it
    progresses. Artifacts: ``comparison/comparison.json``, and ``comparison/report.html``
    when the caller passes the rendered report (``report_html``, from
    :func:`dashboards.report.render_report`): presentation is the caller's, so this
    module does not import ``dashboards``.
    """
    import json

    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    run_id = parent_run_id or comparison.parent_run_id
    if run_id is None:
        raise ComparisonError("no parent run to log the comparison on")
    client = MlflowClient(tracking_uri)
    stamp = int(time.time() * 1000)
    metrics = comparison_metrics(comparison)
    tags = comparison_tags(comparison)
    items = [Metric(k, v, stamp, 0) for k, v in metrics.items()]
    # log_batch takes at most 1000 metrics per call.
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start : start + 1000])
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    payload = json.dumps(comparison.to_dict(), indent=1, allow_nan=False)
    client.log_text(run_id, payload, f"{ARTIFACT_DIR}/{JSON_ARTIFACT}")
    if report_html is not None:
        client.log_text(run_id, report_html, f"{ARTIFACT_DIR}/{HTML_ARTIFACT}")
    return metrics
