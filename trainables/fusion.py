"""Fold fusion: the folds of one trial, or of all the trials of a group trial, trained as
one fused model.

:class:`Fusion` stacks its trainers' folds into one :class:`FusedFolds` (one vmapped
module, data, optimizer, guard and scaler over the fused slots, :mod:`trainables.stacked`)
where :func:`fuse_plan` says so and a first fused step runs; otherwise the folds train
one after another and ``unfused_reason`` says why: a fold that cannot fuse is a fallback,
never an error. Fused or not, each fold draws its minibatches in its own order and steps
exactly as often as unfused. Fusion works through the public surface of its trainers
(:class:`FoldTrainer`, which :class:`~trainables.trainer.Trainer` is): they count their
own steps and act on their own divergence. A trainer builds its own fusion (a group,
:mod:`trainables.group`, one for all its trials), so this module does not import the
trainer. Why and what it costs: docs/precision.md, "Fused slots".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from models.base import Family
from trainables.config import TrainConfig
from trainables.cuda_graphs import StepRunner, graph_plan
from trainables.fold_run import EPOCH_START_SAMPLE, FoldRun, TrialDiverged
from trainables.optim import GuardedAdamW
from trainables.precision import F32, LossScaler, PrecisionPolicy, StepGuard, StepResult
from trainables.stacked import StackedFolds, StackedModules, epoch_schedule

log = logging.getLogger(__name__)


@dataclass
class FusedFolds:
    """Folds in fused slots (slot k holds ``runs[k]``): one module, data, optimizer, guard
    and scaler over all of them."""

    runs: list[FoldRun]
    model: StackedModules
    data: StackedFolds
    optimizer: GuardedAdamW
    guard: StepGuard
    scaler: LossScaler | None
    step: StepRunner | None = None  # the step of every slot
    subset_steps: dict[tuple[int, ...], StepRunner] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return self.model.k

    @torch.no_grad()
    def copy_slot(self, source: int, target: int, module: nn.Module) -> None:
        """Slot ``target`` takes slot ``source``'s training state in place, nothing
        unfused: ``module`` (what the target's module is to be: built for its settings,
        holding the state it takes) goes into the slot (:meth:`StackedModules.replace`),
        and ``source``'s optimizer moments, step counts and Kahan compensation, guard
        counters and loss scale are copied into ``target``'s. The other slots are
        untouched. The gradients are dropped and the step runners built again at the
        next step, as after a fuse (a captured graph holds the module's old tensors).
        Raises ValueError, changing nothing, when ``module`` does not fit the stack."""
        self.model.replace(target, module)
        for values in self.optimizer.state.values():
            for value in values.values():  # (K, ...), the step counts (K,)
                value[target].copy_(value[source])
        self.guard.slot(target).load_state_dict(self.guard.slot(source).state_dict())
        if self.scaler is not None:
            self.scaler.slot(target).load_state_dict(self.scaler.slot(source).state_dict())
        for p in self.model.parameters():
            p.grad = None
        self.step = None
        self.subset_steps.clear()


class _SlotOptimizer:
    """What a checkpoint reads of a fused fold's optimizer: its own parameters, and its
    slice of the fused optimizer's state (views)."""

    def __init__(self, fused: FusedFolds, k: int) -> None:
        self.fused, self.k = fused, k

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        group = self.fused.optimizer.param_groups[0]
        own = [mine for _, mine in self.fused.model.pairs(self.k)]
        settings = {
            # lr and weight decay are one value per slot where a group trial's trials differ
            key: value[self.k] if isinstance(value, list | tuple) and key != "betas" else value
            for key, value in group.items()
            if key != "params"
        }
        return [{**settings, "params": own}]

    @property
    def state(self) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        return self.fused.optimizer.slot_state(self.k, self.fused.model.pairs(self.k))


class FoldTrainer(Protocol):
    """What fusion reads and calls of a trainer (:class:`~trainables.trainer.Trainer`):
    its settings and folds, and the steps of one fold on its own."""

    fusion: Fusion[Any]  # the fusion its folds train in; fusion reassigns it

    @property
    def config(self) -> TrainConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def family(self) -> Family: ...

    @property
    def policy(self) -> PrecisionPolicy: ...

    @property
    def folds(self) -> list[FoldRun]: ...

    def train_fold(self, run: FoldRun) -> tuple[torch.Tensor, torch.Tensor]: ...

    def fold_step(self, run: FoldRun) -> StepRunner: ...

    def count_steps(self, steps: int = 1) -> None: ...


TrainerT = TypeVar("TrainerT", bound=FoldTrainer)


class Fusion(Generic[TrainerT]):
    """The fused training of the folds of one or more trainers: a trial's own folds, or
    the folds of a group trial's trials (:class:`trainables.group.TrainerGroup`), as one
    :class:`FusedFolds`. Its steps run with the first trainer's settings (a group's
    trials share every setting a step reads but lr and weight decay, which the fused
    optimizer takes per slot); each trainer counts its own folds' steps and acts on
    its own divergence. A trial that falls back to f32 leaves (:meth:`leave`), one that
    diverges or is stopped is removed (:meth:`remove`): the rest fuse again without it. A
    trial's own divergence is raised; a grouped trial's is kept in ``diverged``."""

    def __init__(self, trainers: Sequence[TrainerT]) -> None:
        self.trainers = list(trainers)
        self.grouped = len(self.trainers) > 1
        self.fused: FusedFolds | None = None
        self.unfused_reason = ""
        self.pending = False  # fuse at the start of the next epoch (a trial that left)
        self.stepping_alone = False  # an epoch is stepping the runs one after another
        self.stopped: set[int] = set()  # ids of removed trainers: they take no more steps
        self.diverged: dict[TrainerT, TrialDiverged] = {}  # trials removed as diverged

    @property
    def host(self) -> TrainerT:
        return self.trainers[0]

    @property
    def runs(self) -> list[FoldRun]:
        return [run for trainer in self.trainers for run in trainer.folds]

    def fuse(self) -> None:
        """Fuse the runs where :func:`fuse_plan` says so and a first fused step runs;
        otherwise they train one after another and ``unfused_reason`` says why."""
        self.pending = False
        host, runs = self.host, self.runs
        planned, why_not = fuse_plan(host.config, host.device, host.family, runs)
        if not planned:
            self.unfused_reason = why_not
            if host.config.fuse != "off" and len(runs) > 1:
                log.info("%s: folds train one after another: %s", host.family.name, why_not)
            return
        # The fused step trains: every slot in training mode. A trial that leaves during
        # an epoch's validation (a divergence at its check) re-fuses the others with some
        # validated (eval mode) and some not yet, and a stack needs one mode.
        for run in runs:
            run.model.train()
        module = StackedModules([run.model for run in runs])
        data, views = StackedFolds.stack([run.data for run in runs])
        try:
            _try_fused_step(module, data, host.policy, host.config.batch_size)
        except torch.cuda.OutOfMemoryError:
            raise  # the share's fault, not fusion's: the trial's OOM path handles it
        except Exception as exc:  # a module vmap cannot batch, or one that refuses to stack
            module.release()
            self.unfused_reason = f"a fused step failed: {type(exc).__name__}: {exc}"
            log.warning(
                "%s: folds train one after another: %s", host.family.name, self.unfused_reason
            )
            return
        k = len(runs)
        owners = [trainer for trainer in self.trainers for _ in trainer.folds]
        optimizer = host.policy.make_optimizer(
            module.parameters(),
            lr=_per_slot([t.config.lr for t in owners]),
            weight_decay=_per_slot([t.config.weight_decay for t in owners]),
            n_slots=k,
        )
        guard = StepGuard(host.device, n_slots=k)
        scaler = host.policy.make_scaler(n_slots=k)
        fused = FusedFolds(runs, module, data, optimizer, guard, scaler)
        for i, run in enumerate(runs):
            for p, state in optimizer.slot_state(i, module.pairs(i)).items():
                saved = run.optimizer.state.get(p, {})
                for key, value in state.items():
                    if key in saved:
                        value.copy_(saved[key])
            guard.slot(i).load_state_dict(run.guard.state_dict())
            if scaler is not None and run.scaler is not None:
                scaler.slot(i).load_state_dict(run.scaler.state_dict())
            run.data = views[i]
            run.optimizer = _SlotOptimizer(fused, i)
            run.guard = guard.slot(i)
            run.scaler = scaler.slot(i) if scaler is not None else None
            run.step = None
        self.fused = fused

    def retry_fused_step(self) -> None:
        """Try a fused step again on the fused model as it is now, nothing kept (as
        :meth:`fuse` does before it fuses): a slot took a module whose settings send the
        step down a path this stack has not run (an exploit made a setting differ between
        slots where all held one value). Where it fails, the runs train one after another
        from here, as a fuse whose tried step failed leaves them, each holding what its
        slot held."""
        fused = self.fused
        if fused is None:
            return
        host = self.host
        try:
            _try_fused_step(fused.model, fused.data, host.policy, host.config.batch_size)
        except torch.cuda.OutOfMemoryError:
            raise  # the share's fault, not fusion's: the trial's OOM path handles it
        except Exception as exc:  # the new per-slot path cannot be batched
            self.unfuse()
            self.unfused_reason = f"a fused step failed: {type(exc).__name__}: {exc}"
            log.warning(
                "%s: folds train one after another: %s", host.family.name, self.unfused_reason
            )

    def settings_changed(self) -> None:
        """Its trainers' lr and weight decay (one of them changed in place: an exploit)
        are the fused optimizer's again, each slot its trainer's, as :meth:`fuse` sets
        them; the step runners are built again at the next step."""
        fused = self.fused
        if fused is None:
            return
        owner_of = {id(run): trainer for trainer in self.trainers for run in trainer.folds}
        owners = [owner_of[id(run)] for run in fused.runs]
        fused.optimizer.set_lr_and_weight_decay(
            _per_slot([t.config.lr for t in owners]),
            _per_slot([t.config.weight_decay for t in owners]),
        )
        fused.step = None
        fused.subset_steps.clear()

    def unfuse(self) -> None:
        """Each run on its own again: its own storage, optimizer, guard and scaler,
        holding what the fused ones held for it."""
        fused = self.fused
        if fused is None:
            return
        saved = [
            (
                {
                    p: {key: v.clone() for key, v in state.items()}
                    for p, state in run.optimizer.state.items()
                },
                run.guard.state_dict(),
                run.scaler.state_dict() if run.scaler is not None else None,
            )
            for run in fused.runs
        ]
        fused.model.release()
        owners = {id(run): trainer for trainer in self.trainers for run in trainer.folds}
        for run, (state, guard_state, scaler_state) in zip(fused.runs, saved, strict=True):
            owner = owners[id(run)]
            cfg = owner.config
            run.optimizer = owner.policy.make_optimizer(
                run.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
            )
            for p, values in run.optimizer.state.items():
                for key, value in values.items():
                    if key in state.get(p, {}):
                        value.copy_(state[p][key])
            run.guard = StepGuard(owner.device)
            run.guard.load_state_dict(guard_state)
            run.scaler = owner.policy.make_scaler()
            if run.scaler is not None and scaler_state is not None:
                run.scaler.load_state_dict(scaler_state)
            run.step = None
        self.fused = None

    def leave(self, trainer: TrainerT) -> None:
        """``trainer`` (unfused, see :meth:`unfuse`) goes on alone: the others fuse again
        without it; its own folds fuse at its next epoch (this one's remaining steps it
        takes unfused, as the epoch's loop expects of a run outside the fused step unit)."""
        self.unfuse()
        self.trainers.remove(trainer)
        trainer.fusion = Fusion([trainer])
        trainer.fusion.pending = True
        self.fuse_again()

    def remove(self, trainer: TrainerT) -> None:
        """``trainer`` stops training (it diverged, or a scheduler stopped it); the others
        fuse again without it. Its folds keep the weights they have, unfused."""
        self.stopped.add(id(trainer))
        if trainer not in self.trainers:  # left earlier: its remaining steps just stop
            return
        self.unfuse()
        self.trainers.remove(trainer)
        trainer.fusion = Fusion([trainer])
        self.fuse_again()

    def fuse_again(self) -> None:
        """Fuse the runs again: now, or at the next epoch while this one steps its runs
        one after another (fusing them mid-loop would pull the loop's runs into it)."""
        if self.stepping_alone:
            self.pending = True
        elif self.trainers:
            self.fuse()

    # ------------------------------------------------------------------------------------
    # one epoch

    def train_epoch(self) -> dict[TrainerT, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One epoch of every run: (loss sum, ok steps) per fold, per trainer."""
        if self.pending:
            self.fuse()
        trainers = list(self.trainers)  # a trial that falls back leaves during the epoch
        if self.fused is None:
            out: dict[TrainerT, list[tuple[torch.Tensor, torch.Tensor]]] = {}
            self.stepping_alone = True
            try:
                for t in trainers:
                    try:
                        out[t] = [t.train_fold(run) for run in t.folds]
                    except TrialDiverged as exc:
                        if not self.grouped:
                            raise
                        self.diverged[t] = exc
                        self.remove(t)
            finally:
                self.stepping_alone = False
            return out
        sums = self._train_fused(self.fused)
        out = {}
        i = 0
        for trainer in trainers:
            if id(trainer) not in self.stopped:
                out[trainer] = sums[i : i + len(trainer.folds)]
            i += len(trainer.folds)
        return out

    def _train_fused(self, fused: FusedFolds) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of every run, fused: each run's minibatches in its own order (as
        unfused), one fused step per batch index. A shorter fold has no batch for the last
        steps: eagerly those steps run the runs that still have one (no compute wasted);
        with CUDA graphs the one captured step runs every run, the others masked off
        (a launch-bound GPU step costs the same, and the profile measured that step). A
        fallback during the epoch fuses again (or not), maybe without a trial that left:
        each step reads the current fused step unit, and runs outside it step alone."""
        host = self.host
        cfg, device = host.config, host.device
        runs = list(fused.runs)
        owners = [trainer for trainer in self.trainers for _ in trainer.folds]
        fused.model.train()
        orders = []
        for run in runs:
            times = run.data.decision_times(run.data.train)
            orders.append(
                times[torch.randperm(times.numel(), generator=run.generator, device=device)]
            )
        times, counts = epoch_schedule(orders, cfg.batch_size, cfg.max_steps_per_epoch)
        for run, order, count in zip(runs, orders, counts, strict=True):
            # KAN's grid refit, on the fold's own module (views of the fused tensors).
            on_epoch_start = getattr(run.model, "on_epoch_start", None)
            if on_epoch_start is not None and count > 0:
                on_epoch_start(run.data.batch(order[: max(cfg.batch_size, EPOCH_START_SAMPLE)]))
        n_steps = max(counts)
        masked = graph_plan(cfg.cuda_graphs, device, host.family)[0]
        active = torch.tensor(  # (K, S): whether run k has a batch at step i
            [[i < count for i in range(n_steps)] for count in counts], device=device
        )
        indices: dict[tuple[int, ...], torch.Tensor] = {}
        loss_sum = torch.zeros(len(runs), dtype=F32, device=device)
        n_ok = torch.zeros(len(runs), dtype=F32, device=device)
        layout: tuple[FusedFolds | None, list[int], torch.Tensor | None] = (None, [], None)
        for i in range(n_steps):
            stepping = tuple(  # the runs with a batch at step i
                m
                for m, count in enumerate(counts)
                if count > i and id(owners[m]) not in self.stopped
            )
            # Read at every step: a bf16 -> f32 fallback (at a divergence check) fuses the
            # runs again, or leaves them on their own when they cannot fuse.
            current = self.fused
            if current is not layout[0]:
                layout = _layout(current, runs, device)
            _, slot_of, by_slot = layout  # fused slot per run (-1: outside); runs by slot
            inside = tuple(m for m in stepping if slot_of[m] >= 0)
            for m in stepping:
                if slot_of[m] < 0:
                    run = runs[m]
                    batch = run.data.batch(times[m, i])
                    loss_m, ok_m = owners[m].fold_step(run)(batch.x, batch.y, batch.gaps)
                    loss_sum[m] += torch.where(ok_m, loss_m, 0.0)
                    n_ok[m] += ok_m
            if current is not None and inside:
                step_times = times[:, i] if by_slot is None else times[by_slot, i]
                if len(inside) == current.k or masked:
                    step_active = active[:, i] if by_slot is None else active[by_slot, i]
                    loss, ok = self._fused_step(current)(step_times, step_active)
                else:
                    slots = tuple(slot_of[m] for m in inside)
                    index = indices.setdefault(slots, torch.tensor(slots, device=device))
                    loss, ok = self._subset_step(current, slots)(step_times.index_select(0, index))
                if by_slot is None:
                    loss_sum += torch.where(ok, loss, 0.0)
                    n_ok += ok
                else:
                    loss_sum.index_add_(0, by_slot, torch.where(ok, loss, 0.0))
                    n_ok.index_add_(0, by_slot, ok.to(F32))
            for trainer in dict.fromkeys(owners):
                stepped = sum(1 for m in stepping if owners[m] is trainer)
                if not stepped:
                    continue
                try:
                    trainer.count_steps(stepped)
                except TrialDiverged as exc:
                    if not self.grouped:
                        raise
                    self.diverged[trainer] = exc  # the group goes on without it
                    self.remove(trainer)
        return list(zip(loss_sum.unbind(), n_ok.unbind(), strict=True))

    def _fused_step(self, fused: FusedFolds) -> StepRunner:
        """The step of every slot, those ``active`` leaves out masked off (built again
        after a fallback dropped it)."""
        if fused.step is None:
            host = self.host
            capture, why_not = graph_plan(host.config.cuda_graphs, host.device, host.family)

            def step(times: torch.Tensor, active: torch.Tensor) -> StepResult:
                return self.fused_step(fused, times, active=active)

            fused.step = StepRunner(
                f"{fused.k} fused folds",
                step,
                capture,
                why_not,
                device=host.device,
                family=host.family.name,
                cuda_graphs=host.config.cuda_graphs,
            )
        return fused.step

    def _subset_step(self, fused: FusedFolds, slots: tuple[int, ...]) -> StepRunner:
        """The eager step of ``slots`` only (the runs that still have batches), one
        runner per set of slots, kept across epochs."""
        runner = fused.subset_steps.get(slots)
        if runner is None:
            device = self.host.device
            index = torch.tensor(slots, device=device)
            active = torch.zeros(fused.k, dtype=torch.bool, device=device)
            active[index] = True

            def step(times: torch.Tensor) -> StepResult:
                return self.fused_step(fused, times, index, active)

            label = f"folds {list(slots)} fused"
            host = self.host
            runner = StepRunner(
                label,
                step,
                False,
                "a subset step runs eagerly",
                device=host.device,
                family=host.family.name,
                cuda_graphs=host.config.cuda_graphs,
            )
            fused.subset_steps[slots] = runner
        return runner

    def fused_step(
        self,
        fused: FusedFolds,
        times: torch.Tensor,
        slots: torch.Tensor | None = None,
        active: torch.Tensor | None = None,
    ) -> StepResult:
        """One step of every slot on its minibatch at ``times[k]`` (``(K, B)``); a slot
        ``active`` (``(K,)``) leaves out takes no step and counts no skip. With ``slots``
        (indices, ``times`` then ``(M, B)``) only those compute at all. Loss and ok are
        ``(K,)``."""
        host = self.host
        batch = fused.data.batch(times, slots)
        with host.policy.autocast():
            losses = fused.model.loss(batch, slots)
        if slots is not None:
            every = losses.new_zeros(fused.k)  # a slot left out: loss 0, no gradient
            losses = every.index_copy(0, slots, losses)
        return host.policy.backward_and_step(
            losses, fused.optimizer, fused.guard, host.config.grad_clip, fused.scaler, active=active
        )


def _layout(
    fused: FusedFolds | None, runs: Sequence[FoldRun], device: torch.device
) -> tuple[FusedFolds | None, list[int], torch.Tensor | None]:
    """Where each of the epoch's ``runs`` sits in ``fused`` (-1: outside it), and the
    epoch's run index of each fused slot (None when that is every run, in order)."""
    if fused is None:
        return None, [-1] * len(runs), None
    slot = {id(run): k for k, run in enumerate(fused.runs)}
    slot_of = [slot.get(id(run), -1) for run in runs]
    if slot_of == list(range(len(runs))):
        return fused, slot_of, None
    order = [0] * fused.k
    for m, k in enumerate(slot_of):
        if k >= 0:
            order[k] = m
    return fused, slot_of, torch.tensor(order, device=device)


def _per_slot(values: list[float]) -> float | list[float]:
    """One value when every slot has it (the optimizer's scalar path), else a list."""
    return values[0] if all(v == values[0] for v in values) else values


def fuse_plan(
    config: TrainConfig, device: torch.device, family: Family, folds: Sequence[FoldRun]
) -> tuple[bool, str]:
    """(train the folds fused?, why not) for ``trainer.fuse``."""
    if config.fuse == "off":
        return False, "trainer.fuse is off"
    if not family.fuses:
        why = (
            "its environments and replay have no slot dimension"
            if family.kind == "rl"
            else "Family.fusable is False"
        )
        return False, f"{family.name} does not fuse: {why}"
    if len(folds) < 2 and config.fuse == "auto":
        return False, "one fold: nothing to fuse"
    if device.type == "cpu" and not family.fuse_on_cpu and config.fuse == "auto":
        return False, f"{family.name} steps slower fused on a CPU (Family.fuse_on_cpu)"
    short = [
        run.index for run in folds if run.data.train[1] - run.data.train[0] < config.batch_size
    ]
    if short:
        return (
            False,
            f"fold(s) {short} have fewer training windows than batch_size {config.batch_size}",
        )
    return True, ""


# Windows a fused try-out step takes off CUDA: whether vmap batches a module does not
# depend on the batch, and a full batch made the try-out cost a training step (a fifth
# of profiling a default-size bf16 tft on a CPU). Two, not one: a batch of one is a case
# of its own (batch norm refuses it in training). On CUDA the try-out takes the trial's
# batch: cuBLAS and cuDNN choose kernels by shape, so a batched kernel a full batch
# lacks fails there as the first real step would, and the folds train unfused. (Only
# that shape: a step of some slots (a subset step) or a captured graph may still meet a
# kernel of their own later, as before.)
TRIED_WINDOWS = 2


def tried_windows(device: torch.device, batch_size: int) -> int:
    """Windows per slot the fused try-out step takes on ``device`` (:data:`TRIED_WINDOWS`)."""
    return batch_size if device.type == "cuda" else min(batch_size, TRIED_WINDOWS)


def _try_fused_step(
    module: StackedModules, data: StackedFolds, policy: PrecisionPolicy, batch_size: int
) -> None:
    """Forward and backward of a fused step on the last :func:`tried_windows` windows,
    nothing kept: raises what the first real step would raise for being fused (a module
    vmap cannot batch; on CUDA, a batched kernel the batch's shapes lack). Random streams
    are forked, so trying draws nothing from the trial's."""
    device = data.features.device
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        n = data.features.shape[1]
        tried = tried_windows(device, batch_size)
        times = torch.arange(n - tried, n, device=device).expand(module.k, -1)
        with policy.autocast():
            loss = module.loss(data.batch(times))
        loss.float().sum().backward()
    for p in module.parameters():
        p.grad = None
