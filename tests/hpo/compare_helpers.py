"""A synthetic comparison sweep in MLflow, written by the real tracking callback.

The store is made by :class:`hpo.tracking.MlflowSweepCallback` fed with fake Tune trials
(no Ray cluster), so it has exactly the runs, tags and per-epoch metrics a sweep writes,
and a change of tracking conventions breaks the comparison tests instead of hiding.

Known final values (3 epochs, the final one is the value below):

* tft, 6 pairs: the bf16 trial of c002 diverges in epoch 3 (its NaN Sharpe is not logged,
  so MLflow still holds the finite epoch-2 value); the bf16 trial of c004 falls back to
  f32 and completes.
* dqn, 6 pairs: the bf16 trial of c005 is still running (2 of 3 epochs).

Every epoch reports a checkpoint with a ``returns.csv`` (:func:`synthetic_returns`: its
validation track's Sharpe is exactly that epoch's logged per-period Sharpe), and the
callback logs the final one as the run's artifact (:data:`hpo.tracking.RETURNS_ARTIFACT`),
except for the f32 trial of dqn c000 (:data:`NO_RETURNS`: checkpoints without the file),
so dqn's PBO and that pair's tests are "not available".
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpo.compare import TrialRecord, TrialReturns
from hpo.stats import probabilistic_sharpe_ratio, sharpe_moments
from hpo.tracking import MlflowSweepCallback, start_sweep_run
from trainables.returns_file import returns_csv as write_returns

EPOCHS = 3
PERIODS_PER_YEAR = 252
NAN = math.nan

# model -> precision -> final Sharpe per pair c000..c005 (NAN = diverged / unfinished)
VAL = {
    "tft": {
        "f32": [0.80, 1.10, 0.30, -0.20, 0.50, 0.90],
        "bf16": [0.70, 1.30, NAN, -0.10, 0.40, 0.95],
    },
    "dqn": {
        "f32": [0.20, 0.40, -0.50, 0.10, 0.60, 0.30],
        "bf16": [0.25, 0.35, -0.45, 0.05, 0.70, NAN],
    },
}
TEST = {
    "tft": {
        "f32": [0.40, 0.60, 0.10, -0.30, 0.20, 0.50],
        "bf16": [0.35, 0.70, NAN, -0.25, 0.10, 0.55],
    },
    "dqn": {
        "f32": [0.10, 0.30, -0.40, 0.00, 0.50, 0.20],
        "bf16": [0.15, 0.20, -0.35, 0.05, 0.45, NAN],
    },
}
DIVERGED = {("tft", "bf16", 2)}
FELL_BACK = {("tft", "bf16", 4)}
UNFINISHED = {("dqn", "bf16", 5)}
NO_RETURNS = {("dqn", "f32", 0)}
VAL_BARS = 120  # validation bars per fold (2 folds), the same bars for every trial
TEST_BARS = 80


def pair_id(model: str, index: int, seed: int = 0) -> str:
    return f"{model}-c{index:03d}-s{seed}"


def _value(table: dict[str, dict[str, list[float]]], model: str, precision: str, i: int) -> float:
    """The final value, or for a diverged / unfinished trial the finite value its logged
    epochs are built from (so MLflow holds finite Sharpe ratios for it)."""
    value = table[model][precision][i]
    return 0.6 if math.isnan(value) else value


def moments(model: str, precision: str, index: int) -> dict[str, float]:
    """Per-period Sharpe and moments of a trial's validation returns (final epoch)."""
    final = _value(VAL, model, precision, index)
    offset = 0.01 * index + (0.0 if precision == "f32" else 0.02)
    return {
        "val_sharpe_per_period": final / math.sqrt(PERIODS_PER_YEAR),
        "val_skew": -0.2 + offset,
        "val_kurtosis": 4.0 + 3 * offset,
        "val_n_obs": 300 + 10 * index,
    }


@dataclass
class FakeTrial:
    """What the callback reads from a Tune ``Trial``."""

    trial_id: str
    config: dict[str, Any]
    last_result: dict[str, Any] = field(default_factory=dict)
    error_file: str | None = None
    checkpoint: Any = None
    """The newest reported ``ray.tune.Checkpoint`` (Tune's ``Trial.checkpoint``)."""


def tune_checkpoint(directory: Path, returns_text: str | None) -> Any:
    """A reported Tune checkpoint laid out as trainables.trial reports it: the trainer's
    checkpoint in ``state/`` with ``returns.csv`` checksummed in ``meta.json``."""
    import hashlib
    import json

    from ray import tune

    from trainables.checkpoint_files import CKPT_SUBDIR, META_FILE
    from trainables.returns_file import RETURNS_FILE

    state = directory / CKPT_SUBDIR
    state.mkdir(parents=True, exist_ok=True)
    checksums = {}
    if returns_text is not None:
        (state / RETURNS_FILE).write_text(returns_text)
        checksums[RETURNS_FILE] = hashlib.sha256(returns_text.encode()).hexdigest()
    (state / META_FILE).write_text(json.dumps({"schema": 2, "checksums": checksums}))
    return tune.Checkpoint.from_directory(str(directory))


@dataclass
class SyntheticSweep:
    tracking_uri: str
    experiment: str
    parent_run_id: str
    run_ids: dict[tuple[str, str, int], str]
    """(model, precision, pair index) -> child run id."""


GPU_SHARE = {True: 0.25, False: 0.125}
"""The synthetic trials' GPU share: f32 (True) and every other precision."""


def _epoch_result(model: str, precision: str, index: int, epoch: int) -> dict[str, Any]:
    final_val = _value(VAL, model, precision, index)
    final_test = _value(TEST, model, precision, index)
    # Earlier epochs differ from the final one, so reading a non-final step shows.
    scale = epoch / EPOCHS
    fell_back = (model, precision, index) in FELL_BACK and epoch >= 2
    return {
        "epoch": epoch,
        "training_iteration": epoch,
        "train_loss": 1.0 / epoch,
        "val_sharpe": final_val * scale + (0.0 if epoch == EPOCHS else 0.05),
        "test_sharpe": final_test * scale + (0.0 if epoch == EPOCHS else 0.05),
        **moments(model, precision, index),
        "skipped_steps": 3 if fell_back else 0,
        "steps_per_s": (50.0 if precision == "f32" else 80.0) + index,
        "peak_mem_mb": (100.0 if precision == "f32" else 60.0) + index,
        "fell_back_to_f32": int(fell_back),
        "diverged": 0,
        # Costs as trainables.trial reports them: bf16 epochs take 0.6x the time on half
        # the GPU share, so every configuration's bf16/f32 GPU-hours ratio is 0.3.
        "time_s_total": epoch * (2.0 if precision == "f32" else 1.2),
        "cpu_s_total": epoch * (1.5 if precision == "f32" else 1.0),
        "gpu_fraction": GPU_SHARE[precision == "f32"],
        "gpu_s_total": GPU_SHARE[precision == "f32"] * epoch * (2.0 if precision == "f32" else 1.2),
    }


def build_sweep(
    tmp_path: Path, name: str = "cmp-synthetic", precisions: tuple[str, ...] = ("f32", "bf16")
) -> SyntheticSweep:
    """Write the synthetic comparison sweep into ``tmp_path/mlflow.db``.

    Precisions beyond f32/bf16 reuse the bf16 values shifted by -0.05 and always complete.
    """
    from mlflow.tracking import MlflowClient

    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri)
    # Artifacts under tmp_path too (MLflow's default root is ./mlruns in the cwd).
    client.create_experiment(name, artifact_location=(tmp_path / "artifacts").as_uri())
    spec_payload = {"name": name, "precisions": list(precisions), "compare": True}
    parent = start_sweep_run(client, name, spec_payload, compare=True)
    callback = MlflowSweepCallback(tracking_uri, name, parent)
    run_ids: dict[tuple[str, str, int], str] = {}
    number = 0
    for model in VAL:
        for index in range(6):
            for precision in precisions:
                number += 1
                source = precision if precision in VAL[model] else "bf16"
                trial = FakeTrial(
                    trial_id=f"t{number:04d}",
                    config={
                        "family": model,
                        "precision": precision,
                        "seed": 0,
                        "config_id": f"{model}-c{index:03d}",
                        "pair_id": pair_id(model, index),
                        "params": {"lr": 1e-3 * (index + 1)},
                    },
                )
                key = (model, precision, index)
                _play(
                    callback,
                    trial,
                    model,
                    source,
                    index,
                    shift=source != precision,
                    checkpoint_dir=tmp_path / "checkpoints" / trial.trial_id,
                    with_returns=key not in NO_RETURNS,
                    seed=number,
                )
                assert callback.flush()
                run_ids[key] = callback.run_ids[trial.trial_id]
    return SyntheticSweep(tracking_uri, name, parent, run_ids)


def _play(
    callback: MlflowSweepCallback,
    trial: FakeTrial,
    model: str,
    precision: str,
    index: int,
    shift: bool,
    checkpoint_dir: Path,
    with_returns: bool,
    seed: int,
) -> None:
    key = (model, precision, index)
    diverged = key in DIVERGED and not shift
    unfinished = key in UNFINISHED and not shift
    callback.on_trial_start(0, [], trial)
    last_epoch = EPOCHS - 1 if (diverged or unfinished) else EPOCHS
    for epoch in range(1, last_epoch + 1):
        result = _epoch_result(model, precision, index, epoch)
        if shift:
            result["val_sharpe"] -= 0.05
            result["test_sharpe"] -= 0.05
            result["val_sharpe_per_period"] -= 0.05 / math.sqrt(PERIODS_PER_YEAR)
            result["fell_back_to_f32"] = 0
        trial.last_result = result
        # Each epoch reports a checkpoint whose returns are that epoch's (the callback
        # logs only the last one, when the trial ends).
        sr = result["val_sharpe_per_period"]
        sr_test = result["test_sharpe"] / math.sqrt(PERIODS_PER_YEAR)
        text = synthetic_returns(sr, sr_test, seed=seed) if with_returns else None
        trial.checkpoint = tune_checkpoint(checkpoint_dir / f"epoch{epoch}", text)
        callback.on_trial_result(0, [], trial, result)
    if unfinished:
        return
    if diverged:
        # What trainables.trial reports: the last good epoch's metrics, a NaN Sharpe.
        result = {
            **trial.last_result,
            "val_sharpe": NAN,
            "diverged": 1,
            "failure_reason": "tft diverged under f32: 8 consecutive non-finite steps",
        }
        trial.last_result = result
        callback.on_trial_result(0, [], trial, result)
    callback.on_trial_complete(0, [], trial)


def finite_pairs(model: str, split: str = "val") -> tuple[list[float], list[float]]:
    """Reference (f32) and bf16 values of the pairs that the comparison must use, in
    pair order; unfinished pairs left out, diverged ones as NaN."""
    table = VAL if split == "val" else TEST
    a, b = [], []
    for index in range(6):
        if (model, "bf16", index) in UNFINISHED:
            continue
        a.append(table[model]["f32"][index])
        b.append(table[model]["bf16"][index])
    return a, b


_BUILT: dict[tuple[str, ...], SyntheticSweep] = {}


SHARED_PRECISIONS = ("f32", "bf16", "bf16-mixed")


def shared_sweep(
    tmp_path_factory: pytest.TempPathFactory, precisions: tuple[str, ...] = SHARED_PRECISIONS
) -> SyntheticSweep:
    """The synthetic sweep (f32, bf16 and bf16-mixed), built once per test session: a
    fresh SQLite store costs ~10 s of migrations on a slow disk, and 36 trials as many
    again. Read it only; :func:`copy_sweep` before writing."""
    if precisions not in _BUILT:
        _BUILT[precisions] = build_sweep(
            tmp_path_factory.mktemp("cmp-store"), precisions=precisions
        )
    return _BUILT[precisions]


def copy_sweep(sweep: SyntheticSweep, dest: Path) -> SyntheticSweep:
    """A private copy of ``sweep``'s store under ``dest`` (same run ids), safe to write to.

    Artifacts of the copy still go to the original experiment's artifact location, so a
    test that logs artifacts reads them back through MLflow, never from a path it guesses.
    """
    source = Path(sweep.tracking_uri.removeprefix("sqlite:///"))
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest / source.name)
    return SyntheticSweep(
        f"sqlite:///{dest / source.name}", sweep.experiment, sweep.parent_run_id, sweep.run_ids
    )


# ---------------------------------------------------------------------------------------
# Trial records without MLflow, for the statistics on fixed data (hpo.compare.compare_trials)


def trial_record(
    model: str,
    precision: str,
    group: int,
    seed: int,
    val: float,
    test: float | None = None,
    state: str = "completed",
) -> TrialRecord:
    """A completed (by default) trial of configuration ``group`` and ``seed``, named as the
    sweep searcher names them (``<model>-g<NNN>``, pair ``<group>-s<seed>``)."""
    config_id = f"{model}-c{group:03d}"
    pair = f"{config_id}-s{seed}"
    return TrialRecord(
        run_id=f"run-{model}-{precision}-{pair}",
        trial_id=f"{model}-{precision}-{pair}",
        family=model,
        precision=precision,
        seed=str(seed),
        pair_id=pair,
        config_id=config_id,
        state=state,  # type: ignore[arg-type]
        epochs=EPOCHS,
        val_sharpe=val,
        test_sharpe=val if test is None else test,
        sharpe_per_period=val / math.sqrt(PERIODS_PER_YEAR),
        skew=0.0,
        kurtosis=3.0,
        n_obs=500,
        psr=math.nan,
        fell_back_to_f32=False,
        peak_mem_mb=math.nan,
        steps_per_s=math.nan,
        failure_reason=None,
    )


def paired_records(
    model: str, f32: list[list[float]], bf16: list[list[float]]
) -> list[TrialRecord]:
    """Both trials of every (configuration, seed): ``f32[g][s]`` and ``bf16[g][s]`` are
    the validation (and test) Sharpe ratios of configuration ``g``, seed ``s``."""
    out = []
    for g, (ref, other) in enumerate(zip(f32, bf16, strict=True)):
        for s, (a, b) in enumerate(zip(ref, other, strict=True)):
            out.append(trial_record(model, "f32", g, s, a))
            out.append(trial_record(model, "bf16", g, s, b))
    return out


# ---------------------------------------------------------------------------------------
# Return series (the runs' returns artifact) on fixed data

START = np.datetime64("2021-01-04T00:00:00", "ns")
BAR = np.timedelta64(1, "D")


def _exact_sharpe(z: np.ndarray, sr: float, vol: float = 0.01) -> np.ndarray:
    """Returns with per-period Sharpe exactly ``sr`` (ddof=1) from shocks ``z``."""
    z = (z - z.mean()) / z.std(ddof=1)
    return vol * (sr + z)


def synthetic_returns(sr_val: float, sr_test: float, seed: int) -> str:
    """A trial's returns artifact: 2 validation folds of :data:`VAL_BARS` bars whose joined
    Sharpe is ``sr_val`` per period, then :data:`TEST_BARS` test bars with Sharpe
    ``sr_test``; the shocks are shared in part across trials (a common market) so the
    PBO and the pair tests see correlated series, as real ones are."""
    common = np.random.default_rng(7).standard_normal(2 * VAL_BARS + TEST_BARS)
    own = np.random.default_rng(seed).standard_normal(2 * VAL_BARS + TEST_BARS)
    z = 0.8 * common + 0.6 * own
    val = _exact_sharpe(z[: 2 * VAL_BARS], sr_val)
    test = _exact_sharpe(z[2 * VAL_BARS :], sr_test)
    return returns_csv([val[:VAL_BARS], val[VAL_BARS:]], test)


def returns_csv(
    val_folds: list[np.ndarray], test: np.ndarray, skip: int = 0, start_bar: int = 0
) -> str:
    """The text of a returns artifact: validation folds one after another in time (daily
    bars from ``START`` + ``start_bar``), then the test period after them (last fold's).
    ``skip`` drops the first bars of every segment (a longer lookback)."""
    bar = start_bar
    segments = []
    parts = [("val", k, r) for k, r in enumerate(val_folds)]
    parts.append(("test", len(val_folds) - 1, test))
    for split, fold, values in parts:
        stamps = START + (bar + np.arange(len(values))) * BAR
        segments.append((split, fold, stamps[skip:], np.asarray(values)[skip:]))
        bar += len(values)
    return write_returns(segments)


def record_with_returns(
    model: str,
    precision: str,
    group: int,
    seed: int,
    val_folds: list[np.ndarray],
    test: np.ndarray,
    *,
    val_sharpe: str = "joined",
    skip: int = 0,
) -> TrialRecord:
    """A completed trial whose metrics are those of its return series, as the trainer logs
    them: ``val_sharpe`` the annualised Sharpe of the joined validation returns (or, with
    ``val_sharpe="fold_mean"``, the mean of the folds' Sharpes, a metric the selection
    must not read), per-period Sharpe and moments of the joined track."""
    kept = [r[skip:] for r in val_folds]
    joined = np.concatenate(kept)
    moments_ = sharpe_moments(joined)
    annual = math.sqrt(PERIODS_PER_YEAR)
    if val_sharpe == "joined":
        val = moments_.sr * annual
    else:
        val = float(np.mean([sharpe_moments(r).sr * annual for r in kept]))
    test_sharpe = sharpe_moments(test[skip:]).sr * annual
    record = trial_record(model, precision, group, seed, val, test_sharpe)
    record.sharpe_per_period = moments_.sr
    record.skew, record.kurtosis, record.n_obs = moments_.skew, moments_.kurtosis, moments_.n_obs
    record.psr = probabilistic_sharpe_ratio(
        moments_.sr, 0.0, moments_.n_obs, moments_.skew, moments_.kurtosis
    )
    record.returns = TrialReturns.from_csv(returns_csv(val_folds, test, skip=skip))
    return record
