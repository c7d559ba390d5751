"""Ensembles of a sweep's best trials, chosen and weighted on validation only.

    hpo ensemble hpo-results/quick --top 2 --weighting stacked --out ensembles/quick

1. Selection: per family, the ``top`` finished (Tune ``TERMINATED``, not diverged) trials
   with a checkpoint, ranked by ``val_sharpe`` (ties by trial id). ``test_*`` never enters
   selection or weighting.
2. Evaluation: each member's checkpoint is loaded (any precision) and run in the
   inference precision (``auto``: bf16 on Ampere+, else f32) on its trial's own data: every
   fold's model on its validation window and the last fold's on the test period, with a
   confidence per asset and bar (:mod:`trainables.ensemble`).
3. Weights, from the members' validation tracks only (:data:`WEIGHTINGS`): ``equal``
   (1 / M); ``psr`` (proportional to each member's PSR against 0 on its joined validation
   returns); ``inverse-variance`` (1 / variance of its validation returns); ``stacked``
   (the non-negative weights summing to 1 that maximise the Sharpe of the ensemble's joined
   validation returns, SLSQP from equal weights, shrunk toward equal weights:
   ``w = (1 - d) w* + d / M``, d = :data:`STACKED_SHRINKAGE` = 0.5).
4. Report: the ensemble backtested on the held-out test bars all members share, beside
   the best single member on the same bars; its deflated Sharpe counts it as one more
   thing tried (``n_trials + 1``, its validation Sharpe among the variance's inputs).
5. Output: the ensemble directory (a checkpoint ``hpo predict`` serves) and an MLflow run
   under the sweep's parent run, tag ``hpo.role = ensemble``.
Why these weightings: docs/ensembles.md#weights
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cluster.storage import local_copy
from trainables.checkpoint import load_checkpoint
from trainables.ensemble import (
    ENSEMBLE_FILE,
    POSITIONS_FILE,
    EnsembleMember,
    MemberSpec,
    Track,
    combine_tracks,
    evaluate_member,
    member_dirname,
    positions_csv,
    save_ensemble,
    track_backtest,
    track_returns,
)

if TYPE_CHECKING:
    import torch

    from hpo.record import SweepRecord
    from hpo.trials import TrialRow

WEIGHTINGS = ("psr", "inverse-variance", "equal", "stacked")
STACKED_SHRINKAGE = 0.5
ROLE_ENSEMBLE = "ensemble"  # beside hpo.tracking's ROLE_SWEEP / ROLE_TRIAL
REPORTED = ("sharpe", "sortino", "max_drawdown", "turnover", "hit_rate")


class EnsembleError(ValueError):
    """The ensemble cannot be built as asked (the message says why and what to change)."""


# --------------------------------------------------------------------------------------
# 1. selection


def select_members(
    rows: Sequence[TrialRow],
    top: int = 1,
    families: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
) -> list[TrialRow]:
    """The best ``top`` finished trials per family by validation Sharpe (families in
    alphabetical order, best first within a family)."""
    if top < 1:
        raise EnsembleError(f"--top must be >= 1, got {top}")
    eligible = [
        r
        for r in rows
        if r.done  # not an OOM attempt whose retry is still to run
        and not r.diverged
        and r.val_sharpe is not None
        and r.checkpoint is not None
        and (not families or r.family in families)
        and (not precisions or r.precision in precisions)
    ]
    by_family: dict[str, list[TrialRow]] = {}
    for row in eligible:
        by_family.setdefault(row.family, []).append(row)
    chosen: list[TrialRow] = []
    for family in sorted(by_family):
        ranked = sorted(by_family[family], key=lambda r: (-(r.val_sharpe or 0.0), r.trial_id))
        chosen.extend(ranked[:top])
    if not chosen:
        wanted = f" (families {list(families or [])}, precisions {list(precisions or [])})"
        raise EnsembleError(
            f"no finished trial with a validation Sharpe and a checkpoint matches{wanted}"
        )
    return chosen


# --------------------------------------------------------------------------------------
# 3. weights


def member_weights(
    method: str, members: Sequence[EnsembleMember], val_returns: Sequence[np.ndarray]
) -> np.ndarray:
    """(M,) weights summing to 1, from validation returns and tracks only."""
    from hpo.stats import probabilistic_sharpe_ratio, sharpe_moments

    m = len(members)
    equal = np.full(m, 1.0 / m)
    if method == "equal" or m == 1:
        return equal if m > 1 else np.ones(1)
    if method == "psr":
        raw = np.array(
            [
                probabilistic_sharpe_ratio(mom.sr, 0.0, mom.n_obs, mom.skew, mom.kurtosis)
                for mom in (sharpe_moments(r) for r in val_returns)
            ]
        )
    elif method == "inverse-variance":
        var = np.array([float(np.var(r, ddof=1)) for r in val_returns])
        raw = np.divide(1.0, var, out=np.zeros(m), where=var > 0)
    elif method == "stacked":
        raw = stacked_weights(members)
    else:
        raise EnsembleError(f"--weighting must be one of {list(WEIGHTINGS)}, got {method!r}")
    total = float(raw.sum())
    return raw / total if total > 0 and np.all(np.isfinite(raw)) else equal


def stacked_weights(
    members: Sequence[EnsembleMember], shrinkage: float = STACKED_SHRINKAGE
) -> np.ndarray:
    """argmax_w Sharpe(ensemble's joined validation returns), w >= 0, sum w = 1, then
    shrunk: (1 - shrinkage) w* + shrinkage / M."""
    from scipy.optimize import minimize

    from trainables.backtest import sharpe_ratio

    m = len(members)
    market, config = members[0].market, members[0].config
    tracks = [mr.val for mr in members]
    typical = typical_confidences(members)

    def negative_sharpe(w: np.ndarray) -> float:
        w = np.clip(w, 0.0, None)
        if w.sum() <= 0:
            return 0.0
        returns = track_returns(combine_tracks(tracks, w, typical), market, config)
        return -sharpe_ratio(returns, config.periods_per_year)

    start = np.full(m, 1.0 / m)
    result = minimize(
        negative_sharpe,
        start,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda w: float(np.sum(w)) - 1.0}],
        options={"maxiter": 200, "ftol": 1e-9},
    )
    best = np.clip(result.x, 0.0, None) if np.all(np.isfinite(result.x)) else start
    if best.sum() <= 0 or negative_sharpe(best) > negative_sharpe(start):
        best = start  # never worse on validation than where it started
    best = best / best.sum()
    return (1.0 - shrinkage) * best + shrinkage * start


def typical_confidences(members: Sequence[EnsembleMember]) -> np.ndarray:
    return np.array([mr.typical_confidence for mr in members], dtype=np.float64)


# --------------------------------------------------------------------------------------
# 2 + 4. evaluation


@dataclass
class EnsembleResult:
    rows: list[TrialRow]
    members: list[EnsembleMember]
    weights: np.ndarray
    weighting: str
    val: Track
    test: Track
    metrics: dict[str, float]
    best_member: int  # index into members: highest val_sharpe
    out: Path | None = None
    run_id: str | None = None
    specs: list[MemberSpec] = field(default_factory=list)


def evaluate_ensemble(
    rows: Sequence[TrialRow],
    all_rows: Sequence[TrialRow],
    weighting: str = "psr",
    device: torch.device | None = None,
    precision: str = "auto",
) -> EnsembleResult:
    """Load, evaluate and weight the chosen trials; backtest on validation and test."""
    if weighting not in WEIGHTINGS:
        raise EnsembleError(f"--weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}")
    members = []
    for row in rows:
        assert row.checkpoint is not None
        with local_copy(row.checkpoint) as local:
            ckpt = load_checkpoint(local)
        members.append(evaluate_member(ckpt, device=device, precision=precision))
    _check_same_data(rows, members)
    market, config = members[0].market, members[0].config
    val_returns = [track_returns(mr.val, market, config) for mr in members]
    weights = member_weights(weighting, members, val_returns)
    typical = typical_confidences(members)
    val = combine_tracks([mr.val for mr in members], weights, typical)
    test = combine_tracks([mr.test for mr in members], weights, typical)
    best = max(range(len(rows)), key=lambda i: (rows[i].val_sharpe or -math.inf, -i))

    metrics: dict[str, float] = {}
    ens_val = track_returns(val, market, config)
    best_val = val_returns[best]
    from trainables.backtest import sharpe_ratio

    metrics["val_sharpe"] = sharpe_ratio(ens_val, config.periods_per_year)
    metrics["best_member.val_sharpe"] = sharpe_ratio(best_val, config.periods_per_year)
    ens_test = track_backtest(test, market, config)
    best_test = track_backtest(members[best].test.at(test.timestamps), market, config)
    for key in REPORTED:
        metrics[f"test_{key}"] = float(getattr(ens_test, key))
        metrics[f"best_member.test_{key}"] = float(getattr(best_test, key))
    metrics["test_sharpe_minus_best"] = ens_test.sharpe - best_test.sharpe
    metrics["test_n_bars"] = float(ens_test.n_periods)
    metrics["val_confidence_mean"] = float(val.confidence.mean())
    metrics["test_confidence_mean"] = float(test.confidence.mean())
    metrics.update(_deflation(all_rows, ens_val, best_val, config.periods_per_year))
    for i, (row, w) in enumerate(zip(rows, weights, strict=True)):
        metrics[f"weight.{i:02d}.{row.family}"] = float(w)
    return EnsembleResult(
        rows=list(rows),
        members=members,
        weights=weights,
        weighting=weighting,
        val=val,
        test=test,
        metrics=metrics,
        best_member=best,
    )


def _deflation(
    all_rows: Sequence[TrialRow], ens_val: np.ndarray, best_val: np.ndarray, ppy: float
) -> dict[str, float]:
    """DSR of the ensemble and of the best member with the ensemble counted as one more
    trial: n_trials + 1, per-period validation Sharpes of all scored trials plus the
    ensemble's in the variance."""
    from hpo.stats import deflated_sharpe_ratio, sharpe_moments

    n_trials = len(all_rows) + 1
    srs = [r.val_sharpe / math.sqrt(ppy) for r in all_rows if r.val_sharpe is not None]
    ens = sharpe_moments(ens_val)
    srs.append(ens.sr)
    variance = float(np.var(srs, ddof=1)) if len(srs) >= 2 else 0.0
    best = sharpe_moments(best_val)
    return {
        "n_trials": float(n_trials),
        "val_dsr": deflated_sharpe_ratio(
            ens.sr, variance, n_trials, ens.n_obs, ens.skew, ens.kurtosis
        ),
        "best_member.val_dsr": deflated_sharpe_ratio(
            best.sr, variance, n_trials, best.n_obs, best.skew, best.kurtosis
        ),
    }


def _check_same_data(rows: Sequence[TrialRow], members: Sequence[EnsembleMember]) -> None:
    first = members[0]
    for row, mr in zip(rows[1:], members[1:], strict=True):
        same = (
            mr.config.data == first.config.data
            and mr.config.cost == first.config.cost
            and mr.config.periods_per_year == first.config.periods_per_year
        )
        if not same:
            raise EnsembleError(
                f"trial {row.trial_id} trades other data or costs than {rows[0].trial_id} "
                f"({mr.config.data} cost {mr.config.cost} vs {first.config.data} cost "
                f"{first.config.cost}); members must share bars and costs"
            )


# --------------------------------------------------------------------------------------
# 5. the checkpoint and the MLflow run


def write_ensemble(result: EnsembleResult, out: Path, extra: dict[str, Any]) -> Path:
    specs = []
    for i, (row, mr, w) in enumerate(zip(result.rows, result.members, result.weights, strict=True)):
        specs.append(
            MemberSpec(
                name=member_dirname(i, row.family, row.trial_id),
                trial_id=row.trial_id,
                family=row.family,
                precision=mr.precision,
                weight=float(w),
                val_sharpe=row.val_sharpe,
                error_scale=mr.error_scales[-1],
                typical_confidence=mr.typical_confidence,
                source=str(row.checkpoint),
            )
        )
    result.specs = specs
    assets = result.members[0].ckpt.meta.get("assets") or [
        str(a) for a in result.members[0].market.features.assets
    ]
    manifest = {
        "weighting": result.weighting,
        "stacked_shrinkage": STACKED_SHRINKAGE if result.weighting == "stacked" else None,
        "evaluated_in": result.members[0].ran_in,
        "metrics": result.metrics,
        "assets": list(assets),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }
    text = positions_csv({"val": result.val, "test": result.test}, assets)
    members = [(spec, mr.ckpt) for spec, mr in zip(specs, result.members, strict=True)]
    result.out = save_ensemble(out, members, manifest, positions_csv=text)
    return result.out


def log_ensemble_run(result: EnsembleResult, record: SweepRecord, options: dict[str, Any]) -> str:
    """The ``ensemble`` run under the sweep's parent run: members (trial ids, run ids,
    precisions), weights, metrics per split, the manifest and positions as artifacts."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from hpo.tracking import TAG_PARENT, TAG_ROLE, TAG_SWEEP, TAG_TRIAL

    client = MlflowClient(record.tracking_uri)
    parent = client.get_run(record.parent_run_id)
    experiment_id = parent.info.experiment_id
    trial_runs = {
        r.data.tags.get(TAG_TRIAL): r.info.run_id
        for r in client.search_runs(
            [experiment_id], filter_string=f"tags.`{TAG_PARENT}` = '{record.parent_run_id}'"
        )
    }
    run = client.create_run(
        experiment_id,
        run_name=f"ensemble-{result.weighting}-{len(result.rows)}",
        tags={
            TAG_ROLE: ROLE_ENSEMBLE,
            TAG_PARENT: record.parent_run_id,
            TAG_SWEEP: record.spec.name,
            "weighting": result.weighting,
        },
    )
    run_id = run.info.run_id
    try:
        params = [Param(k, str(v)) for k, v in options.items()]
        params.append(Param("n_members", str(len(result.rows))))
        members = []
        for i, (row, mr, w) in enumerate(
            zip(result.rows, result.members, result.weights, strict=True)
        ):
            entry = {
                "trial_id": row.trial_id,
                "run_id": trial_runs.get(row.trial_id, ""),
                "family": row.family,
                "precision": mr.precision,
                "weight": float(w),
                "val_sharpe": row.val_sharpe,
            }
            members.append(entry)
            for key in ("trial_id", "family", "precision"):
                params.append(Param(f"member.{i:02d}.{key}", str(entry[key])))
        stamp = int(time.time() * 1000)
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), stamp, 0) for k, v in result.metrics.items()],
            params=params,
            tags=[RunTag("members", ",".join(f"{m['family']}:{m['trial_id']}" for m in members))],
        )
        client.log_dict(run_id, {"members": members}, "ensemble/members.json")
        if result.out is not None:
            client.log_artifact(run_id, str(result.out / POSITIONS_FILE), "ensemble")
            client.log_artifact(run_id, str(result.out / ENSEMBLE_FILE), "ensemble")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    result.run_id = run_id
    return run_id


def build_ensemble(
    sweep_dir: str | Path,
    out: Path,
    top: int = 1,
    families: Sequence[str] | None = None,
    precisions: Sequence[str] | None = None,
    weighting: str = "psr",
    device: torch.device | None = None,
    precision: str = "auto",
    log_mlflow: bool = True,
) -> EnsembleResult:
    """The whole ``hpo ensemble`` command: select, evaluate, weight, write, log."""
    from hpo.record import SweepRecord
    from hpo.trials import trial_rows

    record = SweepRecord.read(sweep_dir)
    rows = trial_rows(record.sweep_dir)
    chosen = select_members(rows, top, families, precisions)
    result = evaluate_ensemble(chosen, rows, weighting, device=device, precision=precision)
    options = {
        "sweep": str(record.sweep_dir),
        "top": top,
        "families": ",".join(families or []),
        "of_precision": ",".join(precisions or []),
        "weighting": weighting,
        "precision": result.members[0].ran_in,
    }
    write_ensemble(result, Path(out), {"sweep": options["sweep"], "options": options})
    if log_mlflow:
        log_ensemble_run(result, record, options)
        _annotate_run_id(result)
    return result


def _annotate_run_id(result: EnsembleResult) -> None:
    """Record the MLflow run in the manifest (re-checksummed: the manifest lists the
    other files, not itself)."""
    assert result.out is not None
    path = result.out / ENSEMBLE_FILE
    payload = json.loads(path.read_text())
    payload["mlflow_run_id"] = result.run_id
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    tmp.replace(path)
