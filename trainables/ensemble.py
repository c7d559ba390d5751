"""Ensembles of trial checkpoints: each member's position *and confidence* per bar, their
bar-by-bar combination, and the ensemble checkpoint that ``hpo predict`` serves.

Every member contributes, per asset and bar, its position p in [-1, 1] (bit-identical to
the family's ``positions`` / ``act``) and a confidence c in [0, 1] through the protocol of
:mod:`models.base` (``forecast_signal`` for forecasters, ``act_and_confidence`` for rl
learners; each ``Family.confidence`` states it): erf(|move| / (sqrt(2) sigma)) for
forecasters (sigma: the predicted spread, or for point forecasters the fold's validation
RMSE, kept in the manifest), the normalized best-action margin for DQN, the chosen
action's probability for PPO.

Combination (one asset, one bar; validation weights w_i >= 0 summing to 1, typical
confidences cbar_i = each member's mean confidence over its validation bars)::

    alpha_i    = w_i (c_i / cbar_i) / sum_j w_j (c_j / cbar_j)   (= w_i when all c = 0)
    position   = clip(sum_i alpha_i p_i, -1, 1)
    confidence = (sum_i w_i c_i) * |sum_i alpha_i p_i| / sum_i alpha_i |p_i|

One member alone is reproduced bit for bit. The ensemble checkpoint is a directory:
``ensemble.json`` (schema, weighting, members with trial id, family, precision, weight and
validation RMSE, metrics, SHA-256 of files), ``members/NAME/`` (each a trial checkpoint of
its last fold, which ``hpo predict`` also serves alone) and ``positions.csv``. Safetensors
and JSON only, written to a temp sibling and renamed. Formulas and why: docs/ensembles.md
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.base import (
    Batch,
    ConfidentForecaster,
    ConfidentLearner,
    DataShape,
    Family,
    ForecastSignal,
    Obs,
    action_to_position,
)
from trainables.backtest import BacktestResult, backtest
from trainables.checkpoint import (
    META_FILE,
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    sha256_file,
    write_json,
)
from trainables.config import TrainConfig
from trainables.dataset import FoldData, build_fold
from trainables.env import greedy_positions
from trainables.inference import (
    EVAL_CHUNK,
    Prediction,
    bars_backtest,
    check_fits,
    clipped_positions,
    fold_indices,
    inference_data,
    load_fold_model,
    read_features,
)
from trainables.market import Market, build_market
from trainables.precision import PrecisionPolicy, default_device, get_policy

ENSEMBLE_FILE = "ensemble.json"
ENSEMBLE_SCHEMA = 1
MEMBERS_DIR = "members"
POSITIONS_FILE = "positions.csv"
SQRT2 = math.sqrt(2.0)

__all__ = [
    "ENSEMBLE_FILE",
    "EnsembleCheckpoint",
    "EnsembleMember",
    "MemberSpec",
    "Track",
    "combine",
    "evaluate_member",
    "is_ensemble_dir",
    "load_ensemble",
    "predict_ensemble",
    "save_ensemble",
]


# --------------------------------------------------------------------------------------
# The protocol every family module implements (models.base)


def move_confidence(move: torch.Tensor, sigma: torch.Tensor | float) -> torch.Tensor:
    """erf(|move| / (sqrt(2) sigma)) = 2 Phi(|move| / sigma) - 1, in [0, 1]; 0 where
    sigma is not positive."""
    sigma_t = torch.as_tensor(sigma, dtype=torch.float32, device=move.device)
    ok = sigma_t > 0
    ratio = move.abs() / torch.where(ok, sigma_t, torch.ones_like(sigma_t))
    return torch.where(ok, torch.erf(ratio / SQRT2), torch.zeros_like(ratio))


def forecast_signal(family: Family, model: nn.Module, batch: Batch) -> ForecastSignal:
    if not isinstance(model, ConfidentForecaster):
        raise ValueError(f"family {family.name!r} does not report a confidence (forecast_signal)")
    return model.forecast_signal(batch)


def act_and_confidence(
    family: Family, model: nn.Module, obs: Obs
) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(model, ConfidentLearner):
        raise ValueError(
            f"family {family.name!r} does not report a confidence (act_and_confidence)"
        )
    return model.act_and_confidence(obs)


# --------------------------------------------------------------------------------------
# One member over a span of decision bars


@dataclass(frozen=True)
class SpanSignal:
    positions: np.ndarray  # (N, A) float64, clipped to [-1, 1]
    confidence: np.ndarray  # (N, A) float64 in [0, 1]
    sq_error: float  # point forecasters: sum of (move - target)^2 over the span
    n: int  # values behind sq_error


@torch.no_grad()
def span_signal(
    family: Family,
    model: nn.Module,
    data: FoldData,
    span: tuple[int, int],
    policy: PrecisionPolicy,
    n_actions: int,
    error_scale: float | None = None,
) -> SpanSignal:
    """Positions and confidences at decision bars ``span`` (the trainer's and predict's
    own evaluation loops, with the confidence read alongside).

    A point forecaster without ``error_scale`` gets confidences from the RMSE measured on
    this very span (how validation calibrates it).
    """
    model.eval()
    with policy.autocast():
        if family.kind == "rl":
            positions, confidence = _greedy(family, model, data, span, n_actions)
            sq_error, n = 0.0, 0
        else:
            pos_chunks, moves, spreads, errors = [], [], [], []
            device = data.features.device
            for t in torch.arange(*span, device=device).split(EVAL_CHUNK):
                batch = data.batch(t)
                signal = forecast_signal(family, model, batch)
                pos_chunks.append(signal.positions.float())
                moves.append(signal.move.float())
                if signal.spread is not None:
                    spreads.append(signal.spread.float())
                else:
                    errors.append((signal.move.float() - batch.y.float()).square())
            positions = torch.cat(pos_chunks)
            move = torch.cat(moves)
            if spreads:
                confidence = move_confidence(move, torch.cat(spreads))
                sq_error, n = 0.0, 0
            else:
                err = torch.cat(errors)
                sq_error, n = float(err.double().sum()), err.numel()
                scale = error_scale if error_scale is not None else math.sqrt(sq_error / n)
                confidence = move_confidence(move, scale)
    host = clipped_positions(positions, f"{family.name}: the model")
    conf = np.nan_to_num(confidence.double().cpu().numpy(), nan=0.0)
    return SpanSignal(host, np.clip(conf, 0.0, 1.0), sq_error, n)


def _greedy(
    family: Family, model: nn.Module, data: FoldData, span: tuple[int, int], n_actions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """trainables.env.greedy_positions with the learner's act_and_confidence, also
    collecting each step's confidence: (N, A) positions and (N, A) confidences, f32."""
    confidences: list[torch.Tensor] = []

    def act(obs: Obs) -> torch.Tensor:
        action, confidence = act_and_confidence(family, model, obs)
        confidences.append(confidence.float())
        return action_to_position(action, n_actions)

    positions = greedy_positions(act, data.features, data.lookback, span)
    return positions, torch.stack(confidences)


# --------------------------------------------------------------------------------------
# A member over its sweep's data: every fold's validation window and the test period


@dataclass(frozen=True)
class Track:
    """Positions and confidences at decision bars (time order)."""

    timestamps: np.ndarray  # (N,) datetime64[ns]
    positions: np.ndarray  # (N, A)
    confidence: np.ndarray  # (N, A)
    segment: np.ndarray  # (N,) int: backtest segments (a member's fold; w resets between)

    def at(self, stamps: np.ndarray) -> Track:
        """The rows at ``stamps`` (all present)."""
        index = np.searchsorted(self.timestamps, stamps)
        return Track(stamps, self.positions[index], self.confidence[index], self.segment[index])


@dataclass(frozen=True)
class EnsembleMember:
    """One member evaluated on its trial's own data in an inference precision."""

    ckpt: Checkpoint
    family: str
    precision: str  # the trial's (its weights' dtype)
    ran_in: str  # the precision it was evaluated in here
    val: Track
    test: Track
    error_scales: list[float | None]  # per fold: validation RMSE of point forecasts
    market: Market
    config: TrainConfig

    @property
    def typical_confidence(self) -> float:
        """Mean confidence over the validation bars (the vote's normalizer)."""
        return float(self.val.confidence.mean())


def evaluate_member(
    ckpt: Checkpoint, device: torch.device | None = None, precision: str = "auto"
) -> EnsembleMember:
    """Every fold's model on its validation window, the last fold's on the test period,
    exactly as the trainer scores them (same data pipeline, folds and chunking)."""
    device = device or default_device()
    policy = get_policy(precision, device)
    config = TrainConfig.from_dict(ckpt.meta["config"])
    market = build_market(config)
    stamps = market.features.timestamps
    folds = fold_indices(ckpt)
    if folds != list(range(len(market.splits.folds))):
        raise CheckpointError(
            ckpt.path, f"holds folds {folds}, its data config gives {len(market.splits.folds)}"
        )
    shape = DataShape(**ckpt.meta["data_shape"])
    val_parts: list[tuple[int, tuple[int, int], SpanSignal]] = []
    scales: list[float | None] = []
    test: SpanSignal | None = None
    for k in folds:
        family, model, _, _ = load_fold_model(ckpt, k, policy)
        data = build_fold(market, k, config.lookback, device, policy.data_dtype)
        val = span_signal(family, model, data, data.val, policy, shape.n_actions)
        scale = math.sqrt(val.sq_error / val.n) if val.n else None
        scales.append(scale)
        val_parts.append((k, data.val, val))
        if k == folds[-1]:
            test = span_signal(family, model, data, data.test, policy, shape.n_actions, scale)
    assert test is not None
    val_track = Track(
        timestamps=np.concatenate([stamps[a:b] for _, (a, b), _ in val_parts]),
        positions=np.concatenate([s.positions for *_, s in val_parts]),
        confidence=np.concatenate([s.confidence for *_, s in val_parts]),
        segment=np.concatenate([np.full(b - a, k) for k, (a, b), _ in val_parts]),
    )
    a, b = market.splits.test
    test_track = Track(stamps[a:b], test.positions, test.confidence, np.full(b - a, folds[-1]))
    return EnsembleMember(
        ckpt=ckpt,
        family=ckpt.meta["family"],
        precision=str(ckpt.meta["precision"]),
        ran_in=policy.name,
        val=val_track,
        test=test_track,
        error_scales=scales,
        market=market,
        config=config,
    )


# --------------------------------------------------------------------------------------
# Combination


def combine(
    positions: np.ndarray,
    confidence: np.ndarray,
    weights: np.ndarray,
    typical: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Members' (M, N, A) positions and confidences with (M,) weights and (M,) typical
    confidences (None: all 1) -> the ensemble's (N, A) position in [-1, 1] and
    confidence in [0, 1] (module docstring)."""
    p = np.asarray(positions, dtype=np.float64)
    c = np.asarray(confidence, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    cbar = np.ones_like(w) if typical is None else np.asarray(typical, dtype=np.float64)
    if cbar.shape != w.shape:
        raise ValueError(f"combine: typical {cbar.shape}, weights {w.shape}")
    cbar = np.where(cbar > 0, cbar, 1.0)
    if p.shape != c.shape or p.ndim != 3 or w.shape != (p.shape[0],):
        raise ValueError(
            f"combine: positions {p.shape}, confidence {c.shape}, weights {w.shape}; "
            "expected (M, N, A), (M, N, A), (M,)"
        )
    if not (np.all(w >= 0) and w.sum() > 0):
        raise ValueError(f"combine: weights must be >= 0 and not all 0, got {w.tolist()}")
    w = w / w.sum()
    votes = w[:, None, None] * (c / cbar[:, None, None])  # (M, N, A)
    total = votes.sum(axis=0)  # (N, A)
    fallback = np.broadcast_to(w[:, None, None], p.shape).copy()
    alpha = np.divide(votes, total, out=fallback, where=total > 0)
    raw = (alpha * p).sum(axis=0)  # (N, A)
    magnitude = (alpha * np.abs(p)).sum(axis=0)
    agreement = np.divide(np.abs(raw), magnitude, out=np.ones_like(raw), where=magnitude > 0)
    mean_conf = (w[:, None, None] * c).sum(axis=0)
    return np.clip(raw, -1.0, 1.0), np.clip(mean_conf * agreement, 0.0, 1.0)


def combine_tracks(
    tracks: Sequence[Track], weights: np.ndarray, typical: np.ndarray | None = None
) -> Track:
    """Members' tracks on their common bars -> the ensemble's track there. Backtest
    segments break wherever any member's segment (fold) does."""
    common = tracks[0].timestamps
    for track in tracks[1:]:
        common = np.intersect1d(common, track.timestamps)
    if common.size < 2:
        raise ValueError("the members share fewer than 2 decision bars")
    aligned = [t.at(common) for t in tracks]
    positions, confidence = combine(
        np.stack([t.positions for t in aligned]),
        np.stack([t.confidence for t in aligned]),
        weights,
        typical,
    )
    keys = np.stack([t.segment for t in aligned], axis=1)  # (N, M)
    change = np.concatenate([[0], np.any(keys[1:] != keys[:-1], axis=1).cumsum()])
    return Track(common, positions, confidence, change.astype(np.int64))


def track_returns(track: Track, market: Market, config: TrainConfig) -> np.ndarray:
    """The joined per-period returns of a track: one backtest per segment, concatenated
    (as the trainer joins its folds' validation backtests)."""
    index = np.searchsorted(market.features.timestamps, track.timestamps)
    out = []
    for seg in np.unique(track.segment):
        rows = track.segment == seg
        if rows.sum() < 2:
            continue
        result = backtest(
            track.positions[rows],
            market.features.bar_returns[index[rows]],
            cost=config.cost,
            periods_per_year=config.periods_per_year,
        )
        out.append(result.returns)
    return np.concatenate(out)


def track_backtest(track: Track, market: Market, config: TrainConfig) -> BacktestResult:
    """One backtest over the whole track (the test period is one segment)."""
    return bars_backtest(track.positions, market.features, track.timestamps, config)


# --------------------------------------------------------------------------------------
# The ensemble checkpoint


@dataclass(frozen=True)
class MemberSpec:
    """A member as the manifest records it."""

    name: str  # directory under members/
    trial_id: str
    family: str
    precision: str
    weight: float
    val_sharpe: float | None
    error_scale: float | None  # point forecasters: last fold's validation RMSE
    typical_confidence: float = 1.0  # mean confidence over its validation bars
    source: str = ""  # the trial checkpoint it was copied from

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EnsembleCheckpoint:
    path: Path
    members: list[MemberSpec]
    checkpoints: list[Checkpoint]
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def weights(self) -> np.ndarray:
        return np.array([m.weight for m in self.members], dtype=np.float64)

    @property
    def typical(self) -> np.ndarray:
        return np.array([m.typical_confidence for m in self.members], dtype=np.float64)


def is_ensemble_dir(path: Path | str) -> bool:
    return (Path(path) / ENSEMBLE_FILE).is_file()


def member_dirname(index: int, family: str, trial_id: str) -> str:
    return f"{index:02d}-{family}-{trial_id}"


def save_ensemble(
    directory: Path,
    members: Sequence[tuple[MemberSpec, Checkpoint]],
    manifest: Mapping[str, Any],
    positions_csv: str = "",
) -> Path:
    """Write the ensemble checkpoint atomically: each member as a one-fold trial
    checkpoint (its last fold), then the manifest listing every file's SHA-256."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        checksums: dict[str, str] = {}
        for spec, ckpt in members:
            last = fold_indices(ckpt)[-1]
            prefix = f"fold{last}."
            weights = {k: v for k, v in ckpt.weights.items() if k.startswith(prefix)}
            state = {
                k: v
                for k, v in ckpt.state.items()
                if k in (f"{prefix}feature_mean", f"{prefix}feature_std")
            }
            keep = (
                "family",
                "kind",
                "precision",
                "requested_precision",
                "weights_dtype",
                "fell_back_to_f32",
                "epoch",
                "global_step",
                "config",
                "assets",
                "feature_names",
                "data_shape",
                "torch_version",
            )
            meta = {k: ckpt.meta[k] for k in keep if k in ckpt.meta}
            meta.update(
                trial_id=spec.trial_id,
                source=spec.source,
                fold=last,
                error_scale=spec.error_scale,
                ensemble_member=True,
            )
            member = tmp / MEMBERS_DIR / spec.name
            save_checkpoint(member, weights, {}, state, meta)
            checksums[f"{MEMBERS_DIR}/{spec.name}/{META_FILE}"] = sha256_file(member / META_FILE)
        if positions_csv:
            (tmp / POSITIONS_FILE).write_text(positions_csv)
            checksums[POSITIONS_FILE] = sha256_file(tmp / POSITIONS_FILE)
        payload = {
            **manifest,
            "schema_version": ENSEMBLE_SCHEMA,
            "kind": "ensemble",
            "members": [spec.to_dict() for spec, _ in members],
            "checksums": checksums,
        }
        write_json(tmp / ENSEMBLE_FILE, payload)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_ensemble(directory: Path, device: torch.device | str = "cpu") -> EnsembleCheckpoint:
    """Read and verify an ensemble checkpoint; any problem raises CheckpointError naming
    the file (the manifest's checksums pin each member's meta.json, which pins its
    safetensors)."""
    directory = Path(directory)
    path = directory / ENSEMBLE_FILE
    if not path.is_file():
        raise CheckpointError(path, "missing (not an ensemble directory)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("schema_version") != ENSEMBLE_SCHEMA:
        raise CheckpointError(
            path,
            f"schema_version {manifest.get('schema_version')!r}, this build reads {ENSEMBLE_SCHEMA}"
            if isinstance(manifest, dict)
            else "expected a JSON object",
        )
    checksums = manifest.get("checksums")
    if not isinstance(checksums, dict):
        raise CheckpointError(path, "no checksums; the ensemble cannot be verified")
    for name, digest in sorted(checksums.items()):
        file = directory / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise CheckpointError(path, f"lists a file outside it: {name!r}")
        if not file.is_file():
            raise CheckpointError(file, "missing (listed in ensemble.json)")
        if sha256_file(file) != digest:
            raise CheckpointError(file, "checksum mismatch (truncated or corrupted file)")
    members = [MemberSpec(**m) for m in manifest.get("members", [])]
    if not members:
        raise CheckpointError(path, "lists no members")
    checkpoints = []
    for spec in members:
        meta_key = f"{MEMBERS_DIR}/{spec.name}/{META_FILE}"
        if meta_key not in checksums:
            raise CheckpointError(path, f"has no checksum for {meta_key}")
        checkpoints.append(load_checkpoint(directory / MEMBERS_DIR / spec.name, device))
    return EnsembleCheckpoint(directory, members, checkpoints, manifest)


# --------------------------------------------------------------------------------------
# Serving


def predict_ensemble(
    directory: Path,
    data: Path | str,
    device: torch.device | None = None,
    precision: str = "auto",
) -> Prediction:
    """Positions and confidences of an ensemble for new bars, each member run as
    trainables.predict runs a trial checkpoint, combined on the bars where every member
    has a full window; with the backtest of those bars."""
    device = device or default_device()
    ensemble = load_ensemble(Path(directory), device="cpu")
    policy = get_policy(precision, device)
    first_config = TrainConfig.from_dict(ensemble.checkpoints[0].meta["config"])
    fs = read_features(data, first_config)
    tracks = []
    for spec, ckpt in zip(ensemble.members, ensemble.checkpoints, strict=True):
        check_fits(fs, ckpt, data, f"member {spec.name}")
        shape = DataShape(**ckpt.meta["data_shape"])
        fold = fold_indices(ckpt)[-1]
        family, model, config, _ = load_fold_model(ckpt, fold, policy)
        bars, span = inference_data(fs, ckpt, fold, config.lookback, policy, data)
        signal = span_signal(family, model, bars, span, policy, shape.n_actions, spec.error_scale)
        stamps = fs.timestamps[span[0] : span[1]]
        tracks.append(Track(stamps, signal.positions, signal.confidence, np.zeros(len(stamps))))
    combined = combine_tracks(tracks, ensemble.weights, ensemble.typical)
    return Prediction(
        timestamps=combined.timestamps,
        assets=tuple(fs.assets),
        positions=combined.positions,
        confidence=combined.confidence,
        backtest=bars_backtest(combined.positions, fs, combined.timestamps, first_config),
        checkpoint=ensemble.path,
        precision=policy.name,
    )


def positions_csv(tracks: Mapping[str, Track], assets: Sequence[str]) -> str:
    """split,timestamp,asset,position,confidence rows of the named tracks."""
    lines = ["split,timestamp,asset,position,confidence"]
    for split, track in tracks.items():
        stamps = np.datetime_as_string(track.timestamps, unit="s")
        for stamp, row, crow in zip(stamps, track.positions, track.confidence, strict=True):
            for asset, w, c in zip(assets, row, crow, strict=True):
                lines.append(f"{split},{stamp},{asset},{float(w)!r},{float(c)!r}")
    return "\n".join(lines) + "\n"
