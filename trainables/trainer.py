"""The one shared trainer every trial wraps (in-process for ``hpo train``, inside a Ray
Tune trial for sweeps): the trial loop.

One :class:`Trainer` trains a model family under a precision policy on walk-forward folds:
one model per fold, trained side by side (fused where they can be:
:mod:`trainables.fusion`), each validated on its own window every epoch; the last fold's
model trades the held-out test period. An epoch's metrics are those of
:mod:`trainables.epoch_metrics` (``val_sharpe`` of the joined validation returns, never
the test period for selection) and the trainer's own counters. :meth:`Trainer.save`
writes the epoch's return series beside the checkpoint (``returns.csv``: validation per
fold and test). A position that is not finite raises
:class:`~trainables.fold_run.TrialDiverged` naming the fold and split.

Both training paths run through the same guarded step (:mod:`trainables.precision`):
forecast families take shuffled minibatches of windows (an epoch's last short batch is
dropped) -> ``model.loss(batch)``; rl families ``learner.collect(env)``, then one step per
loss of ``learner.losses()``. The host reads device values once per ``log_every`` steps
and at epoch end; on CUDA a forecast step is captured in a CUDA graph and replayed
(:mod:`trainables.cuda_graphs`, ``trainer.cuda_graphs``), elsewhere it runs eagerly.
Fusion trains a trainer's folds through its public methods (:meth:`Trainer.train_fold`,
:meth:`Trainer.fold_step`, :meth:`Trainer.count_steps`).

Resume (``Trainer(config, checkpoint=...)``) is bit-exact on the device type the checkpoint
was written on and deterministic on another; a trial that fell back from bf16 to f32
resumes in f32. Why: docs/statistics.md#one-quantity, docs/precision.md#the-hot-loop
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from models import get_family
from models.base import Batch, DataShape, RLLearner
from trainables.backtest import BacktestResult, backtest
from trainables.checkpoint import (
    RETURNS_FILE,
    Checkpoint,
    CheckpointError,
    portable_generator_states,
    returns_csv,
    save_checkpoint,
)
from trainables.config import TrainConfig
from trainables.cuda_graphs import StepRunner, graph_plan
from trainables.dataset import FoldData, build_fold
from trainables.env import TradingEnv
from trainables.epoch_metrics import OutOfSample, epoch_metrics
from trainables.fold_run import EPOCH_START_SAMPLE, FoldRun, TrialDiverged
from trainables.fusion import FusedFolds, Fusion
from trainables.inference import span_positions
from trainables.market import Market, build_market
from trainables.memory import TrialMemory
from trainables.optim import GuardedAdamW
from trainables.precision import (
    F32,
    PrecisionPolicy,
    StepGuard,
    StepResult,
    default_device,
    dtype_name,
    get_policy,
    is_low_precision,
    promote_to_f32,
)
from trainables.rng_state import default_rng_meta, restore_default_rng

EpochCallback = Callable[["Trainer", dict[str, Any]], None]


def resolve_device(name: str) -> torch.device:
    return default_device() if name == "auto" else torch.device(name)


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        *,
        checkpoint: Checkpoint | None = None,
        device: torch.device | None = None,
        fuse: bool = True,
    ) -> None:
        self.config = config
        self.device = device or resolve_device(config.device)
        self.memory = TrialMemory(self.device)  # before anything of this trial is allocated
        self.family = get_family(config.family)
        self.policy: PrecisionPolicy = get_policy(
            resumed_precision(config, checkpoint), self.device
        )
        self.fell_back_to_f32 = False
        self.fallback_epoch: int | None = None
        self.epoch = 0
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self._evaluated: OutOfSample | None = None  # the latest epoch's, for save()
        self.market: Market = build_market(config)
        self.shape = DataShape(
            n_features=self.market.n_features,
            lookback=config.lookback,
            n_assets=self.market.n_assets,
        )
        self.model_config = self.family.make_config(config.model_config)
        self.folds = [self._build_fold_run(k) for k in range(len(self.market.splits.folds))]
        torch.manual_seed(config.seed)  # the stream dropout and exploration draw from
        if checkpoint is not None:
            self._restore(checkpoint)
        # Fused after the restore: a checkpoint holds each fold apart, fused or not. A
        # group trial (trainables.group) fuses its trials' folds instead: fuse=False.
        self.fusion = Fusion([self])
        if fuse:
            self.fusion.fuse()

    # ------------------------------------------------------------------------------------
    # construction

    @property
    def skipped_steps(self) -> int:
        """Steps skipped so far over all folds (one host read)."""
        return int(sum(int(run.guard.skipped) for run in self.folds))

    @property
    def is_rl(self) -> bool:
        return self.family.kind == "rl"

    @property
    def fused(self) -> FusedFolds | None:
        """The fused step unit this trainer's folds train in (a group's: other trials' folds
        too), or None."""
        return self.fusion.fused

    @property
    def unfused_reason(self) -> str:
        return self.fusion.unfused_reason

    @property
    def step_units(self) -> list[FoldRun | FusedFolds]:
        """What one optimizer step trains: the fused folds, or each fold on its own (their
        ``model`` holds the stepped parameters, their ``optimizer`` steps them)."""
        return [self.fused] if self.fused is not None else list(self.folds)

    def train_unit(self, unit: FoldRun | FusedFolds) -> None:
        """One epoch's training of ``unit`` (no validation; profiling and benchmarks)."""
        if isinstance(unit, FusedFolds):
            self.fusion.train_epoch()
        else:
            self.train_fold(unit)

    def train_fold(self, run: FoldRun) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch's training of fold ``run`` on its own: (sum of the losses of the steps
        it took, steps it took), device tensors. Its steps are counted
        (:meth:`count_steps`), so it may fall back to f32 or raise :class:`TrialDiverged`."""
        return self._train_rl(run) if self.is_rl else self._train_forecast(run)

    def _build_fold_run(self, k: int) -> FoldRun:
        cfg = self.config
        data = build_fold(self.market, k, cfg.lookback, self.device, self.policy.data_dtype)
        torch.manual_seed(_fold_seed(cfg.seed, k))  # each fold's init differs, reproducibly
        model = self.policy.convert_module(self.family.build(self.model_config, self.shape))
        params = model.trainable_parameters() if self.is_rl else model.parameters()  # type: ignore[operator]
        optimizer = self.policy.make_optimizer(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        generator = torch.Generator(device=self.device).manual_seed(_fold_seed(cfg.seed, k))
        env = self._make_env(model, data, k) if self.is_rl else None
        return FoldRun(
            index=k,
            data=data,
            model=model,
            optimizer=optimizer,
            guard=StepGuard(self.device),
            scaler=self.policy.make_scaler(),
            generator=generator,
            env=env,
        )

    def _make_env(self, model: nn.Module, data: FoldData, k: int) -> TradingEnv:
        mc = self.model_config
        return TradingEnv(
            features=data.features,
            bar_returns=data.bar_returns,
            lookback=self.config.lookback,
            decision_range=data.train,
            num_envs=getattr(mc, "num_envs", 16),
            episode_len=min(getattr(mc, "episode_len", 64), data.train[1] - data.train[0] - 1),
            cost=self.config.cost,
            n_actions=self.shape.n_actions,
            seed=_fold_seed(self.config.seed, k) + 1,
        )

    # ------------------------------------------------------------------------------------
    # training

    def fit(self, on_epoch: EpochCallback | None = None) -> list[dict[str, Any]]:
        """Train until ``config.epochs``; ``on_epoch(trainer, metrics)`` after each epoch."""
        while self.epoch < self.config.epochs:
            metrics = self.train_epoch()
            if on_epoch is not None:
                on_epoch(self, metrics)
        return self.history

    def train_epoch(self) -> dict[str, Any]:
        """One epoch: train every fold, validate every fold, test with the last fold."""
        started, cpu_started = time.perf_counter(), time.process_time()
        steps_before = self.global_step
        loss_sums = self.fusion.train_epoch()[self]
        train_seconds = time.perf_counter() - started
        return self.finish_epoch(loss_sums, train_seconds, steps_before, started, cpu_started)

    def finish_epoch(
        self,
        loss_sums: list[tuple[torch.Tensor, torch.Tensor]],
        train_seconds: float,
        steps_before: int,
        started: float,
        cpu_started: float,
    ) -> dict[str, Any]:
        """After an epoch's training (``loss_sums`` per fold): act on divergence, validate
        every fold, test with the last, record the epoch's metrics. ``train_seconds`` and
        the clocks since ``started`` / ``cpu_started`` are this trainer's share (a group
        trial splits its fused training time among its trials)."""
        self._check_divergence()
        steps = self.global_step - steps_before

        val_results = [self.evaluate(run, run.data.val, "val") for run in self.folds]
        test_result = self.evaluate(self.folds[-1], self.folds[-1].data.test, "test")
        self._evaluated = OutOfSample(val=val_results, test=test_result)
        self.epoch += 1
        metrics = self._epoch_metrics(loss_sums, self._evaluated, steps, train_seconds)
        metrics["epoch_time_s"] = time.perf_counter() - started
        metrics["epoch_cpu_s"] = time.process_time() - cpu_started
        # Totals over the trial's epochs, resumes included (the history is checkpointed):
        # what the comparison sums into the cost of a precision. An epoch lost to a crash
        # before its checkpoint is not in them.
        for total, per_epoch in (("time_s_total", "epoch_time_s"), ("cpu_s_total", "epoch_cpu_s")):
            earlier = sum(float(h.get(per_epoch, 0.0)) for h in self.history)
            metrics[total] = earlier + metrics[per_epoch]
        self.history.append(metrics)
        return metrics

    def _train_forecast(self, run: FoldRun) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        run.model.train()
        times = run.data.decision_times(run.data.train)
        order = times[torch.randperm(times.numel(), generator=run.generator, device=self.device)]
        batch_size = min(cfg.batch_size, order.numel())
        n_batches = order.numel() // batch_size
        if cfg.max_steps_per_epoch is not None:
            n_batches = min(n_batches, cfg.max_steps_per_epoch)
        # A family that refits data-dependent state between epochs (KAN's grid update)
        # sees a sample of this epoch's windows first. It draws no random numbers, so the
        # other families' streams are untouched.
        on_epoch_start = getattr(run.model, "on_epoch_start", None)
        if on_epoch_start is not None and n_batches > 0:
            on_epoch_start(run.data.batch(order[: max(batch_size, EPOCH_START_SAMPLE)]))
        loss_sum = torch.zeros((), dtype=F32, device=self.device)
        n_ok = torch.zeros((), dtype=F32, device=self.device)
        for i in range(n_batches):  # every batch has batch_size windows: a short tail is dropped
            batch = run.data.batch(order[i * batch_size : (i + 1) * batch_size])
            loss, ok = self.fold_step(run)(batch.x, batch.y, batch.gaps)
            loss_sum += torch.where(ok, loss, 0.0)
            n_ok += ok
            self.count_steps()
        return loss_sum, n_ok

    def fold_step(self, run: FoldRun) -> StepRunner:
        """The step runner of forecast fold ``run`` on its own (built on first use, and
        again after a fallback dropped it): called with a batch's ``x``, ``y`` and
        ``gaps``, it takes one guarded step and returns (loss, ok). The caller counts the
        step (:meth:`count_steps`)."""
        if run.step is None:
            capture, why_not = graph_plan(self.config.cuda_graphs, self.device, self.family)

            def step(x: torch.Tensor, y: torch.Tensor, gaps: torch.Tensor) -> StepResult:
                return self.forecast_step(run, Batch(x=x, y=y, gaps=gaps))

            run.step = StepRunner(
                f"fold {run.index}",
                step,
                capture,
                why_not,
                device=self.device,
                family=self.family.name,
                cuda_graphs=self.config.cuda_graphs,
            )
        return run.step

    def forecast_step(self, run: FoldRun, batch: Batch) -> StepResult:
        """One eager forecast training step: forward + loss, backward, guarded update."""
        with self.policy.autocast():
            loss = run.model.loss(batch)  # type: ignore[operator]
        return self.policy.backward_and_step(
            loss, cast(GuardedAdamW, run.optimizer), run.guard, self.config.grad_clip, run.scaler
        )

    @property
    def cuda_graphs(self) -> bool:
        """Whether the training steps are replayed from CUDA graphs (all of them)."""
        steps = [unit.step for unit in self.step_units]
        return bool(steps) and all(s is not None and s.replaying for s in steps)

    def _train_rl(self, run: FoldRun) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        learner: RLLearner = run.model  # type: ignore[assignment]
        run.model.train()
        assert run.env is not None
        loss_sum = torch.zeros((), dtype=F32, device=self.device)
        n_ok = torch.zeros((), dtype=F32, device=self.device)
        total = cfg.epochs * cfg.rl_iterations
        for i in range(cfg.rl_iterations):
            progress = (self.epoch * cfg.rl_iterations + i) / total
            with torch.no_grad(), self.policy.autocast():
                learner.collect(run.env, progress)
            losses: Iterator[torch.Tensor] = learner.losses()
            while True:
                with self.policy.autocast():
                    loss = next(losses, None)
                if loss is None:
                    break
                result = self.policy.backward_and_step(
                    loss, cast(GuardedAdamW, run.optimizer), run.guard, cfg.grad_clip, run.scaler
                )
                learner.after_step()
                loss_sum += torch.where(result.ok, result.loss, 0.0)
                n_ok += result.ok
                self.count_steps()
        return loss_sum, n_ok

    def count_steps(self, steps: int = 1) -> None:
        """Count ``steps`` optimizer steps of this trainer's folds (a fused step counts one
        per fold that took it); read the guards once per ``log_every`` of them and act on
        divergence (:meth:`fall_back_to_f32`, or raise :class:`TrialDiverged`)."""
        before = self.global_step
        self.global_step += steps
        if before // self.config.log_every != self.global_step // self.config.log_every:
            self._check_divergence()

    # ------------------------------------------------------------------------------------
    # divergence: skip -> fall back to f32 -> fail

    def _check_divergence(self) -> None:
        """Read the streak counters (one host sync) and act on K consecutive skips."""
        k = self.config.fallback_after
        streak = max(int(run.guard.longest_streak) for run in self.folds)
        if self.policy.name == "bf16" and streak >= k:
            self.fall_back_to_f32()
            return
        # fp16 legitimately skips while its loss scale backs off from 2^16: allow for it.
        limit = k + 16 if self.policy.name == "fp16-mixed" else k
        if streak >= limit:
            raise TrialDiverged(
                f"{self.family.name} diverged under {self.policy.name}: {streak} consecutive "
                f"non-finite steps (loss or gradient norm) in epoch {self.epoch + 1}; "
                f"lower lr (now {self.config.lr:g}) or grad_clip"
            )

    def fall_back_to_f32(self) -> None:
        """Switch a bf16 trial to f32 in place, keeping what it has learned.

        Weights become their f32 master values (bf16 weight + Kahan compensation), the f32
        optimizer moments are kept, gradients are next allocated in f32, data is re-cast
        from the host copy.
        """
        fusion = self.fusion
        fusion.unfuse()  # each fold is promoted on its own; fused again in f32 below
        f32_policy = get_policy("f32", self.device)
        for run in self.folds:
            assert isinstance(run.optimizer, GuardedAdamW)
            promote_to_f32(run.model, run.optimizer)
            # The bf16 .grad buffers outlive the weights' dtype change and the step keeps
            # them (zero_grad(set_to_none=False)): drop them, or every later gradient
            # would still be accumulated in bf16.
            run.model.zero_grad(set_to_none=True)
            run.data = build_fold(
                self.market, run.index, self.config.lookback, self.device, f32_policy.data_dtype
            )
            if run.env is not None:
                env_state = run.env.state_dict()
                run.env = self._make_env(run.model, run.data, run.index)
                run.env.load_state_dict(env_state)
                learner: RLLearner = run.model  # type: ignore[assignment]
                # The learner rebuilds its replay storage in its (now f32) parameter dtype.
                learner.load_buffer_state(learner.buffer_state())
            run.guard.reset_streak()
            run.step = None  # a captured graph holds the bf16 tensors: capture again
        self.policy = f32_policy
        self.fell_back_to_f32 = True
        self.fallback_epoch = self.epoch + 1
        if len(fusion.trainers) > 1:
            fusion.leave(self)  # a grouped trial goes on alone, in f32; the rest fuse again
        else:
            fusion.fuse_again()

    # ------------------------------------------------------------------------------------
    # population-based training

    def take_training_state(
        self, donor: Trainer, config: TrainConfig, models: Sequence[nn.Module] | None = None
    ) -> None:
        """Become ``donor``'s training state under ``config`` (this trial's settings
        after an exploit; :meth:`trainables.group.TrainerGroup.exploit`): every fold's
        weights and buffers, optimizer moments, step counts and Kahan compensation,
        guard and loss scale are copied from the donor's same fold; then ``config``'s lr
        and weight decay, and its model settings, are what the next step uses.

        What stays this trial's own: its seed and minibatch order (the folds'
        generators), its data, epoch, step count and history. Each fold's model is the
        one :meth:`models_taking` builds (``models``, where the caller built them
        already): settings a module keeps (a position scale, a dropout rate buffer) are
        this trial's new ones, state is the donor's.

        Both trainers' folds train unfused (their own optimizers: a group unfuses
        first), or both in slots of one fused unit (a group's fusion): then the copy is
        made within the fused tensors, the donor's slot into this trial's for each fold
        (:meth:`FusedFolds.copy_slot`), and the fused optimizer takes the new lr and
        weight decay for this trial's slots (:meth:`Fusion.settings_changed`); nothing is
        unfused, no step is tried. Raises ValueError, changing nothing, otherwise, and
        when a model built for ``config`` does not fit the fused stack."""
        if self.policy.name != donor.policy.name or len(self.folds) != len(donor.folds):
            raise ValueError(
                f"cannot take the state of a {donor.policy.name} trial with "
                f"{len(donor.folds)} folds into a {self.policy.name} one with {len(self.folds)}"
            )
        fused = self.fused
        runs = [*self.folds, *donor.folds]
        slot = {id(run): k for k, run in enumerate(fused.runs)} if fused is not None else {}
        in_slots = fused is not None and fused is donor.fused
        if in_slots and any(id(run) not in slot for run in runs):
            raise ValueError("take_training_state: a fold is outside the trials' fused unit")
        if not in_slots and not all(isinstance(run.optimizer, GuardedAdamW) for run in runs):
            raise ValueError(
                "take_training_state needs both trials' folds unfused, or fused in one unit"
            )
        model_config = self.family.make_config(config.model_config)
        if models is None:
            models = self.models_taking(donor, config)
        if len(models) != len(self.folds):
            raise ValueError(f"{len(models)} models for {len(self.folds)} folds")
        if in_slots:
            assert fused is not None
            if not all(fused.model.fits(model) for model in models):
                raise ValueError(
                    "a model built for the new settings does not fit the fused stack "
                    "(other parameters, shapes or dtypes)"
                )
            for run, source, model in zip(self.folds, donor.folds, models, strict=True):
                fused.copy_slot(slot[id(source)], slot[id(run)], model)
                run.model = model
                run.step = None
        else:
            for run, source, model in zip(self.folds, donor.folds, models, strict=True):
                optimizer = self.policy.make_optimizer(
                    model.parameters(), lr=config.lr, weight_decay=config.weight_decay
                )
                optimizer.load_state_dict(cast(GuardedAdamW, source.optimizer).state_dict())
                # load_state_dict also copied the donor's lr and weight decay into the
                # groups: set this trial's after it, or the restored state wins over the
                # explored settings (ray-project/ray#62173).
                for group in optimizer.param_groups:
                    group["lr"], group["weight_decay"] = config.lr, config.weight_decay
                run.model, run.optimizer = model, optimizer
                run.guard.load_state_dict(source.guard.state_dict())
                if run.scaler is not None and source.scaler is not None:
                    run.scaler.load_state_dict(source.scaler.state_dict())
                run.step = None  # a step runner (a captured graph) holds the old tensors
        self.config, self.model_config = config, model_config
        if in_slots:  # the fused optimizer reads lr and weight decay per slot
            self.fusion.settings_changed()
        # The latest epoch's returns are of weights this trial no longer holds: a
        # checkpoint before its next epoch writes none rather than wrong ones.
        self._evaluated = None

    def take_checkpoint_state(self, donor: Checkpoint, config: TrainConfig) -> None:
        """Become the training state saved in ``donor`` (another trial's checkpoint, of the
        same family, precision and folds) under ``config``: the exploit of a population
        across processes, where the donor trains in another Tune trial. What moves and
        what stays this trial's own is as in :meth:`take_training_state`; an RL family's
        environments and replay stay this trial's too (its own experience, as its
        minibatch order is). Each fold's model is built afresh for ``config``'s model
        settings (its initial weights from a forked stream) with an optimizer built for
        ``config``'s lr and weight decay, then loaded from the checkpoint as a restore
        loads it: the restored moments never carry the donor's lr
        (ray-project/ray#62173). Folds fused across this trial unfuse around the copy and
        fuse again. Raises ValueError, changing nothing, where the checkpoint is of another
        family, precision or folds (a checkpoint missing a tensor or holding one of
        another shape raises while loading, with some folds replaced: the trial fails)."""
        meta = donor.meta
        if (meta.get("family"), meta.get("precision")) != (self.family.name, self.policy.name):
            raise ValueError(
                f"cannot take the state of a {meta.get('family')}/{meta.get('precision')} "
                f"checkpoint into a {self.family.name}/{self.policy.name} trial"
            )
        missing = [run.index for run in self.folds if not _has_fold(donor, run.index)]
        if missing or _has_fold(donor, len(self.folds)):
            raise ValueError(
                f"the donor's checkpoint {donor.path} holds other folds than this trial's "
                f"{len(self.folds)}"
            )
        model_config = self.family.make_config(config.model_config)
        devices = [self.device] if self.device.type == "cuda" else []
        fused = self.fusion.fused is not None
        self.fusion.unfuse()
        try:
            for run in self.folds:
                with torch.random.fork_rng(devices=devices):  # overwritten: not the trial's draws
                    model = self.policy.convert_module(self.family.build(model_config, self.shape))
                model.train(run.model.training)
                if self.is_rl:  # its own experience: the replay and its counters stay
                    own: RLLearner = run.model  # type: ignore[assignment]
                    cast(RLLearner, model).load_buffer_state(own.buffer_state())
                params = model.trainable_parameters() if self.is_rl else model.parameters()  # type: ignore[operator]
                run.model = model
                run.optimizer = self.policy.make_optimizer(
                    params, lr=config.lr, weight_decay=config.weight_decay
                )
                run.guard = StepGuard(self.device)
                run.scaler = self.policy.make_scaler()
                run.step = None  # a step runner (a captured graph) holds the old tensors
                _load_training_state(run, donor)
            # Before fusing again: the fused optimizer takes each slot's lr and weight
            # decay from its trainer's config (the explored ones, #62173).
            self.config, self.model_config = config, model_config
        finally:
            if fused:
                self.fusion.fuse_again()
        self._evaluated = None  # the latest returns are of weights this trial no longer holds

    def models_taking(self, donor: Trainer, config: TrainConfig) -> list[nn.Module]:
        """Each fold's model as :meth:`take_training_state` leaves it: built afresh from
        ``config``'s model settings and loaded with the donor's same fold's state dict,
        as a checkpoint restore loads one, in the mode the fold's model is in. Draws no
        random numbers (building draws initial weights: from a forked stream)."""
        model_config = self.family.make_config(config.model_config)
        devices = [self.device] if self.device.type == "cuda" else []
        models = []
        for run, source in zip(self.folds, donor.folds, strict=True):
            # The initial weights are overwritten, and must not come out of the stream
            # dropout draws from (it is the group's, shared).
            with torch.random.fork_rng(devices=devices):
                model = self.policy.convert_module(self.family.build(model_config, self.shape))
            model.load_state_dict(source.model.state_dict())
            model.train(run.model.training)  # a fused stack needs one mode in every slot
            models.append(model)
        return models

    # ------------------------------------------------------------------------------------
    # evaluation

    @torch.no_grad()
    def positions(self, run: FoldRun, span: tuple[int, int]) -> torch.Tensor:
        """(T_span, A) f32 positions the fold's model takes at decision bars ``span``."""
        run.model.eval()
        with self.policy.autocast():
            return span_positions(self.family, run.model, run.data, span)

    def evaluate(self, run: FoldRun, span: tuple[int, int], split: str = "val") -> BacktestResult:
        """Fold ``run``'s backtest at decision bars ``span`` (its positions clipped to
        [-1, 1]); non-finite positions raise :class:`TrialDiverged` naming ``split``."""
        positions = self.positions(run, span).double().cpu().numpy()  # (T_span, A)
        bad = ~np.isfinite(positions)
        if bad.any():
            t, a = (int(i) for i in np.argwhere(bad)[0])
            raise TrialDiverged(
                f"{self.family.name} diverged under {self.policy.name}: non-finite positions in "
                f"fold {run.index} {split} at epoch {self.epoch + 1}: {int(bad.sum())} of "
                f"{bad.size} (first at bar {span[0] + t}, asset "
                f"{self.market.features.assets[a]}); the model's output is NaN or inf"
            )
        host = np.clip(positions, -1.0, 1.0)
        bar_returns = self.market.features.bar_returns[span[0] : span[1]]
        return backtest(
            host, bar_returns, cost=self.config.cost, periods_per_year=self.config.periods_per_year
        )

    def _epoch_metrics(
        self,
        loss_sums: list[tuple[torch.Tensor, torch.Tensor]],
        evaluated: OutOfSample,
        steps: int,
        train_seconds: float,
    ) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.global_step,
            **epoch_metrics(loss_sums, evaluated, self.config.periods_per_year),
            "skipped_steps": self.skipped_steps,
            "steps_per_s": steps / train_seconds if train_seconds > 0 else 0.0,
            "peak_mem_mb": self.memory.peak_mb(),
            "fell_back_to_f32": int(self.fell_back_to_f32),
            "cuda_graphs": int(self.cuda_graphs),
            "fused_folds": self.fused.k if self.fused is not None else 0,
        }

    # ------------------------------------------------------------------------------------
    # checkpoints

    def save(self, directory: Path, extra_meta: dict[str, Any] | None = None) -> Path:
        weights: dict[str, torch.Tensor] = {}
        optim: dict[str, torch.Tensor] = {}
        state: dict[str, torch.Tensor] = {}
        for run in self.folds:
            prefix = f"fold{run.index}."
            for name, tensor in run.model.state_dict().items():
                weights[prefix + name] = tensor
            names = {id(p): n for n, p in run.model.named_parameters()}
            optimizer_state = run.optimizer.state  # a fused fold's views: built once here
            for group in run.optimizer.param_groups:
                for p in group["params"]:
                    for key, value in optimizer_state[p].items():
                        optim[f"{prefix}{names[id(p)]}.{key}"] = value
            for key, value in run.guard.state_dict().items():
                optim[f"{prefix}guard.{key}"] = value
            if run.scaler is not None:
                for key, value in run.scaler.state_dict().items():
                    optim[f"{prefix}scaler.{key}"] = value
            state[f"{prefix}generator"] = run.generator.get_state()
            state[f"{prefix}feature_mean"] = torch.as_tensor(
                run.data.feature_mean, dtype=torch.float64
            )
            state[f"{prefix}feature_std"] = torch.as_tensor(
                run.data.feature_std, dtype=torch.float64
            )
            if run.env is not None:
                for key, value in run.env.state_dict().items():
                    state[f"{prefix}env.{key}"] = value
                learner: RLLearner = run.model  # type: ignore[assignment]
                for key, value in learner.buffer_state().items():
                    state[f"{prefix}buffer.{key}"] = value
        meta = {
            "family": self.family.name,
            "kind": self.family.kind,
            "precision": self.policy.name,
            "requested_precision": self.config.precision,
            "weights_dtype": dtype_name(self.policy.param_dtype),
            "fell_back_to_f32": self.fell_back_to_f32,
            "fallback_epoch": self.fallback_epoch,
            "epoch": self.epoch,
            "global_step": self.global_step,
            "config": self.config.to_dict(),
            "history": self.history,
            **default_rng_meta(self.device),
            "torch_version": torch.__version__,
            "assets": list(self.market.features.assets),
            "feature_names": list(self.market.features.names),
            "data_shape": {
                "n_features": self.shape.n_features,
                "lookback": self.shape.lookback,
                "n_assets": self.shape.n_assets,
                "n_actions": self.shape.n_actions,
            },
            **(extra_meta or {}),
        }
        files = {RETURNS_FILE: self._returns_csv()} if self._evaluated is not None else {}
        return save_checkpoint(directory, weights, optim, state, meta, files=files)

    def _returns_csv(self) -> str:
        """The latest epoch's out-of-sample returns: validation per fold, then test."""
        assert self._evaluated is not None
        stamps = self.market.features.timestamps
        segments = []
        for run, result in zip(self.folds, self._evaluated.val, strict=True):
            start, stop = run.data.val
            segments.append(("val", run.index, stamps[start:stop], result.returns))
        last = self.folds[-1]
        start, stop = last.data.test
        segments.append(("test", last.index, stamps[start:stop], self._evaluated.test.returns))
        return returns_csv(segments)

    def _restore(self, ckpt: Checkpoint) -> None:
        """Load ``ckpt`` into freshly built folds, casting to this trainer's policy/device."""
        meta = ckpt.meta
        if meta["family"] != self.family.name:
            raise CheckpointError(
                ckpt.path, f"holds a {meta['family']!r} model, not {self.family.name!r}"
            )
        # Generator states of another device type (a GPU checkpoint resumed on a CPU, or
        # the reverse) are re-derived; on the same device type they load as saved.
        saved_state = portable_generator_states(ckpt.state, self.device, meta["rng_device"])
        for run in self.folds:
            prefix = f"fold{run.index}."
            _load_training_state(run, ckpt)
            run.generator.set_state(
                _require(ckpt, saved_state, f"{prefix}generator", "state.safetensors").cpu()
            )
            if run.env is not None:
                env_prefix, buf_prefix = f"{prefix}env.", f"{prefix}buffer."
                run.env.load_state_dict(
                    {
                        k[len(env_prefix) :]: v
                        for k, v in saved_state.items()
                        if k.startswith(env_prefix)
                    }
                )
                buffer = {
                    k[len(buf_prefix) :]: v
                    for k, v in saved_state.items()
                    if k.startswith(buf_prefix)
                }
                learner: RLLearner = run.model  # type: ignore[assignment]
                learner.load_buffer_state(buffer)  # casts stored windows to this run's dtype
        self.epoch = int(meta["epoch"])
        self.global_step = int(meta["global_step"])
        self.history = list(meta["history"])
        self.fell_back_to_f32 = _stays_fallen_back(self.config, meta)
        self.fallback_epoch = meta["fallback_epoch"] if self.fell_back_to_f32 else None
        restore_default_rng(meta, self.device)


# ----------------------------------------------------------------------------------------


def _load_training_state(run: FoldRun, ckpt: Checkpoint) -> None:
    """Load fold ``run.index``'s training state from ``ckpt`` into ``run`` (unfused):
    weights (with their bf16 Kahan compensation where the fold keeps f32 weights),
    optimizer moments and step counts, guard and loss scale. What a restore and a
    cross-process exploit (:meth:`Trainer.take_checkpoint_state`) both load."""
    prefix = f"fold{run.index}."
    params = {n: p for n, p in run.model.named_parameters()}
    model_state = run.model.state_dict()
    for name, target in model_state.items():
        saved = _require(ckpt, ckpt.weights, prefix + name, "model.safetensors")
        comp = ckpt.optim.get(f"{prefix}{name}.compensation")
        value = (
            saved.float() + comp.float()
            if comp is not None and not is_low_precision(target.dtype)
            else saved
        )
        target.copy_(value.to(target.dtype))
    for name, p in params.items():
        opt_state = run.optimizer.state.get(p)
        if not opt_state:
            continue
        for key, value in opt_state.items():
            stored = ckpt.optim.get(f"{prefix}{name}.{key}")
            if stored is not None:
                value.copy_(stored.to(value.dtype))
            elif key == "compensation":
                value.zero_()
    run.guard.load_state_dict(
        {
            k: _require(ckpt, ckpt.optim, f"{prefix}guard.{k}", "optim.safetensors")
            for k in ("skipped", "streak", "longest_streak")
        }
    )
    if run.scaler is not None and f"{prefix}scaler.scale" in ckpt.optim:
        run.scaler.load_state_dict(
            {
                "scale": ckpt.optim[f"{prefix}scaler.scale"],
                "clean_steps": ckpt.optim[f"{prefix}scaler.clean_steps"],
            }
        )


def _fold_seed(seed: int, fold: int) -> int:
    return seed * 1_000_003 + fold * 7_919


def _require(
    ckpt: Checkpoint, tensors: dict[str, torch.Tensor], key: str, file: str
) -> torch.Tensor:
    try:
        return tensors[key]
    except KeyError:
        raise CheckpointError(
            ckpt.path / file,
            f"has no tensor {key!r} (saved with another model config or fold count?)",
        ) from None


def resumed_precision(config: TrainConfig, checkpoint: Checkpoint | None) -> str:
    """The policy a trial runs under: ``config.precision``, except that a trial which fell
    back from bf16 to f32 stays f32 when it is resumed under the precision it fell back
    from (a Tune retry, ``hpo resume``, ``hpo train --resume``). Asking for another
    precision on resume is honoured."""
    if checkpoint is not None and _stays_fallen_back(config, checkpoint.meta):
        return str(checkpoint.meta["precision"])
    return config.precision


def _stays_fallen_back(config: TrainConfig, meta: Mapping[str, Any]) -> bool:
    """A fallback holds while the trial is resumed under the precision it fell back from;
    a precision asked for on resume is a policy of its own, not a fallback."""
    requested = meta["requested_precision"]
    return bool(meta["fell_back_to_f32"]) and requested == config.precision


def _has_fold(ckpt: Checkpoint, index: int) -> bool:
    prefix = f"fold{index}."
    return any(name.startswith(prefix) for name in ckpt.weights)
