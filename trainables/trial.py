"""The trial loop Ray Tune runs: a thin function around the shared :class:`Trainer` (the
driver names it by :func:`trainables.tune_entry.run_trial`, which imports this module in
the trial's worker).

Config in: a :class:`trainables.config.TrialConfig` dict (encoded by
:class:`hpo.search.sweep_searcher.SweepSearcher`, decoded here by ``TrialConfig.from_dict``).

Each epoch it reports the trainer's metrics together with a checkpoint directory
(``tune.report(metrics, checkpoint=...)``); a restarted trial (FailureConfig retry, or
``hpo resume``) continues from ``tune.get_checkpoint()``, falling back to the trial's
previous checkpoint when the newest one is corrupt. A trial that diverges even after the
bf16 -> f32 fallback reports ``diverged = 1`` with the reason and ends, instead of
raising: retrying a deterministic divergence would only repeat it.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from ray import tune

from trainables.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from trainables.checkpoint_files import CKPT_SUBDIR
from trainables.config import (
    GroupTrialConfig,
    TrainConfig,
    TrialConfig,
    is_group_trial,
)
from trainables.fold_run import TrialDiverged
from trainables.group import trained_settings
from trainables.memory import freeze_long_lived_objects
from trainables.population import (
    LINEAGE_META,
    Exchange,
    PopulationTrial,
    resumed_population_config,
)
from trainables.trainer import Trainer
from trainables.trial_keys import trial_key

log = logging.getLogger("trainables.trial")

_Loaded = TypeVar("_Loaded")


class GpuShare(Protocol):
    """What keeps a trial inside its GPU share: Ray does not enforce fractional shares.
    The sweep hands in :class:`cluster.trial_share.PackedShare`."""

    # ``group_size``: a group trial's (its shape is the fused group's), 1 for a trial alone.
    def cap_memory(
        self, config: TrainConfig, gpu_fraction: float, group_size: int = 1
    ) -> float | None:
        """Cap this process's allocator before anything is built; the cap set, if any."""
        ...

    def memory_metrics(
        self, config: TrainConfig, gpu_fraction: float, group_size: int = 1
    ) -> dict[str, float]:
        """Numbers reported with every epoch (the share, the shape's predicted peak)."""
        ...

    def after_oom(
        self, config: TrainConfig, gpu_fraction: float, message: str, group_size: int = 1
    ) -> dict[str, Any]:
        """Fields of the OOM report (the share to retry at, or why none fits; for a group
        that no share holds, ``oom_split`` 1 and the share of each half), called once the
        failed attempt's memory is freed."""
        ...


class EarlyStop(Protocol):
    """What stops a group trial's trials early where the scheduler cannot: a grouped
    sweep's ASHA, which decides per trial, or ASHA across populations, which decides per
    population (:class:`hpo.rungs.RungJudge`)."""

    def keep(self, trial: str, result: Mapping[str, Any]) -> bool:
        """Whether ``trial`` (its :func:`~trainables.trial_keys.trial_key`) trains on after
        the epoch it reported ``result`` for."""
        ...


def run_trial(
    config: dict[str, Any],
    share: GpuShare | None = None,
    judge: EarlyStop | None = None,
    exchange: Exchange | None = None,
) -> None:
    """Ray Tune function trainable. Without a ``share`` (a direct call) nothing is capped
    and a CUDA out-of-memory error is raised; without a ``judge`` every trial trains to
    its last epoch unless the scheduler stops its Tune trial. A trial of a population
    spanning Tune trials (its config carries ``pbt``, or its group trial's ``population``)
    needs the sweep's board: ``exchange``."""
    freeze_long_lived_objects()  # first, while nothing of this trial exists yet
    resources = tune.get_context().get_trial_resources()
    required = resources.required_resources if resources is not None else {}
    torch.set_num_threads(max(1, int(required.get("CPU", 1))))
    gpu_fraction = float(required.get("GPU", 0.0))
    if is_group_trial(config):
        _train_group(GroupTrialConfig.from_dict(config), gpu_fraction, share, judge, exchange)
        return
    trial = TrialConfig.from_dict(config)
    train_config = trial.train_config()
    keep = _asker(judge, trial_key(trial.to_dict()))
    in_population = None
    if trial.pbt is not None:
        if exchange is None:
            raise ValueError(
                f"trial {trial_key(config)} is in population {trial.population!r}: "
                "it trains in a sweep, whose board (exchange) says whom it copies"
            )
        trial_id = _trial_id()
        if not trial_id:
            raise ValueError("a trial of a population on the board trains in a Tune trial")
        in_population = PopulationTrial(
            exchange, trial.pbt, trial.population, trial_key(config), trial_id
        )
    memory: dict[str, float] = {}
    if share is not None:
        share.cap_memory(train_config, gpu_fraction)
        memory = share.memory_metrics(train_config, gpu_fraction)
    node = _node()
    progress = _Progress()
    oom: str | None = None
    try:
        _train(train_config, {**memory, **node}, node, progress, gpu_fraction, keep, in_population)
    except torch.cuda.OutOfMemoryError as exc:
        if share is None:
            raise
        # Building the trainer, restoring its checkpoint and every epoch are in here: an
        # OOM anywhere is the share's fault. Only the message leaves this block: the
        # exception's traceback holds _train's frame, and with it the trainer and every
        # tensor of the failed step; Python drops ``exc`` at the end of the block.
        oom = str(exc)
    if oom is not None and share is not None:
        _report_oom(train_config, gpu_fraction, progress, oom, node, share)


@dataclass
class _Progress:
    epoch: int = 0  # epochs completed (what an OOM report counts from)
    # The cost totals last reported: a diverged or OOM report carries them on, so the
    # time its epochs took still counts (hpo status, the comparison's cost).
    totals: dict[str, float] = field(default_factory=dict)
    # A population trial's exploits and settings last reported: an OOM report keeps them.
    population: dict[str, Any] = field(default_factory=dict)


def _train(
    train_config: TrainConfig,
    reported: dict[str, Any],
    node: dict[str, str],
    progress: _Progress,
    gpu_fraction: float = 0.0,
    keep: Callable[[Mapping[str, Any]], bool] | None = None,
    in_population: PopulationTrial | None = None,
) -> None:
    """Train to the last epoch (or until ``keep`` says no), reporting each with
    ``reported`` (memory, node) and its GPU cost so far beside it; a trial
    ``in_population`` exploits at its interval boundaries."""
    checkpoint = _restore_checkpoint()
    if in_population is not None and checkpoint is not None:
        # Resumed: the settings its last exploit left it, and its lineage so far.
        train_config = resumed_population_config(train_config, checkpoint)
        in_population.lineage = [dict(e) for e in checkpoint.meta.get(LINEAGE_META, [])]
    trainer = Trainer(train_config, checkpoint=checkpoint)
    del checkpoint  # its tensors are the trainer's now
    progress.epoch = trainer.epoch
    # Restarted: the epoch it resumes from may be one a rung stopped it at, after a
    # snapshot that saw the checkpoint but not the trial's end (asked again: the rungs
    # remember their answer).
    restarted = 0 < trainer.epoch < train_config.epochs
    if keep is not None and restarted and not keep(trainer.history[-1]):
        return
    while trainer.epoch < train_config.epochs:
        try:
            metrics = trainer.train_epoch()
        except TrialDiverged as exc:
            # The epoch that diverged, reported once: no checkpoint (nothing worth resuming).
            tune.report(
                {
                    "epoch": trainer.epoch + 1,
                    "val_sharpe": math.nan,
                    "diverged": 1,
                    "failure_reason": str(exc),
                    "fell_back_to_f32": int(trainer.fell_back_to_f32),
                    "skipped_steps": trainer.skipped_steps,
                    **node,
                    **progress.totals,
                    # Its exploits stay its own: hpo status and the report read this last.
                    **(
                        in_population.reported(trained_settings(trainer))
                        if in_population is not None
                        else {}
                    ),
                }
            )
            return
        # Judged before the report, as a group trial's trials are: a snapshot that holds this
        # epoch's checkpoint then has its decision too (a resume re-runs no stopped epoch).
        going_on = trainer.epoch < train_config.epochs
        stopped = keep is not None and going_on and not keep(metrics)
        population: dict[str, Any] = {}
        if in_population is not None:  # exploits before the checkpoint: a resume goes on
            population = in_population.after_epoch(trainer, metrics)  # its time counted in
        cost = gpu_cost(trainer, gpu_fraction)
        _report(
            trainer,
            {**metrics, "diverged": 0, **reported, **cost, **population},
            in_population.checkpoint_meta() if in_population is not None else None,
        )
        progress.epoch = trainer.epoch
        progress.totals = {
            "time_s_total": metrics["time_s_total"],
            "cpu_s_total": metrics["cpu_s_total"],
            **cost,
        }
        progress.population = population
        if stopped:
            return  # stopped at a rung: its run and checkpoint are this epoch's


GROUP_STATE = "group.json"  # beside the trials' checkpoints: trials that ended, and why
STOPPED_AT_RUNG = "stopped by ASHA at a rung"


def _train_group(
    group: GroupTrialConfig,
    gpu_fraction: float,
    share: GpuShare | None,
    judge: EarlyStop | None = None,
    exchange: Exchange | None = None,
) -> None:
    """Train a group trial's trials as one :class:`~trainables.group.TrainerGroup`. Each
    epoch reports every trial's latest metrics under ``"trials"`` (by
    :meth:`~trainables.config.GroupTrialConfig.slugs`), with each trial's checkpoint in
    ``state/<slug>/``; a trial that diverged, or that ``judge`` stopped (``stopped`` 1),
    keeps its final entry and trains no more, also after a resume. The top-level
    ``val_sharpe`` is the best trial's (what Tune's progress reads). A CUDA OOM anywhere
    is the group's share's fault: every trial still training reports it (``oom`` 1,
    with what ``share`` makes of it), the ended ones their final entries."""
    configs = group.train_configs()
    group_size = len(configs)
    memory: dict[str, float] = {}
    if share is not None:
        share.cap_memory(configs[0], gpu_fraction, group_size)
        memory = share.memory_metrics(configs[0], gpu_fraction, group_size)
    node = _node()
    slugs = group.slugs()
    latest: dict[str, dict[str, Any]] = {}  # each trial's latest entry, by slug
    oom: str | None = None
    try:
        _fit_group(group, gpu_fraction, judge, memory, node, latest, exchange)
    except torch.cuda.OutOfMemoryError as exc:
        if share is None:
            raise
        oom = str(exc)  # only the message leaves: the traceback holds every trial's tensors
    if oom is None or share is None:
        return
    _free_cuda_cache()
    verdict = share.after_oom(configs[0], gpu_fraction, oom, group_size)
    if group.pbt is not None and not group.population:  # one group trial, never split
        verdict = population_oom_verdict(verdict, group_size)
    for slug, config in zip(slugs, configs, strict=True):
        entry = latest.get(slug, {})
        if entry.get("diverged") or entry.get("stopped") or entry.get("epoch", 0) >= config.epochs:
            continue  # ended before the OOM: its result stands
        latest[slug] = {
            **_totals(entry),
            # A population trial's exploits so far stay its own (hpo status, the report).
            **{k: entry[k] for k in ("pbt_exploits", "pbt_lineage") if k in entry},
            "epoch": int(entry.get("epoch", 0)) + 1,
            "val_sharpe": math.nan,
            "oom": 1,
            **node,
            **verdict,
        }
    tune.report(
        {
            "epoch": max(int(m.get("epoch", 0)) for m in latest.values()),
            "val_sharpe": math.nan,
            "oom": 1,
            "group_size": len(slugs),
            "trials": latest,
            **node,
            **verdict,
        }
    )


def population_oom_verdict(verdict: dict[str, Any], group_size: int) -> dict[str, Any]:
    """A population's OOM report: ``verdict`` (:meth:`GpuShare.after_oom`'s), whose
    failure reason names the fix where the group did not fit a whole GPU (``oom_split``):
    the sweep's searcher does not split a population (two halves would be two independent
    populations), so its trials end there."""
    if not verdict.get("oom_split"):
        return verdict
    return {
        **verdict,
        "failure_reason": (
            f"CUDA out of memory on a whole GPU as a population of {group_size} trials: a "
            "population that is one group trial is not split (its halves would be two "
            "independent populations); make it fit with fewer trials (pbt.population_size "
            "x seeds), a smaller grouping.group_size (the population then spans group "
            "trials), a smaller shape, or a GPU with more memory ([resources])"
        ),
    }


def _fit_group(
    group: GroupTrialConfig,
    gpu_fraction: float,
    judge: EarlyStop | None,
    memory: dict[str, float],
    node: dict[str, str],
    latest: dict[str, dict[str, Any]],
    exchange: Exchange | None = None,
) -> None:
    """The group trial's training (see :func:`_train_group`), reporting each epoch with
    ``memory`` and ``node`` in every trial's entry; ``latest`` holds the entries. A
    population that is this group trial exploits in memory; one it is part of, through
    ``exchange`` (the sweep's board), each trial on the board."""
    from trainables.group import TrainerGroup
    from trainables.population import Population, exploit_records, settings_after

    slugs = group.slugs()
    keys = [trial_key(t.to_dict()) for t in group.trials]
    checkpoints, restored, saved_population = _restore_group(slugs)
    latest.update(restored)
    configs = group.train_configs()
    on_board = None
    if group.pbt is not None and group.population:
        # Part of a population that spans several Tune trials: each trial posts to the
        # sweep's board; a resumed one trains on with its explored settings.
        if exchange is None:
            raise ValueError(
                f"group trial of population {group.population!r}: its trials exploit "
                "through the sweep's board (exchange), and there is none"
            )
        configs = [
            resumed_population_config(c, k) for c, k in zip(configs, checkpoints, strict=True)
        ]
        group_id = _trial_id()
        if not group_id:
            raise ValueError("a trial of a population on the board trains in a Tune trial")
        on_board = [
            PopulationTrial(
                exchange,
                group.pbt,
                group.population,
                key,
                f"{group_id}-{slug}",  # the id its MLflow run knows it by
                checkpoint.meta.get(LINEAGE_META, []) if checkpoint is not None else (),
            )
            for key, slug, checkpoint in zip(keys, slugs, checkpoints, strict=True)
        ]
    elif saved_population is not None:  # recipients train on with their explored settings
        configs = settings_after(configs, exploit_records(saved_population))
    trainers = TrainerGroup(configs, checkpoints=checkpoints)
    del checkpoints  # their tensors are the trials' now
    population = None
    # ASHA per trial of the group; a population that is this group trial asks instead
    # as a whole, under its identity (ASHA across populations, pbt.early_stopping).
    judge_trials = judge
    if group.pbt is not None and on_board is None:
        seed = trial_key(group.trials[0].to_dict())  # the group trial's identity
        population = Population(trainers, group.pbt, seed, saved_population)
        judge_trials = None
    for index, slug in enumerate(slugs):
        ended = latest.get(slug, {})
        if ended.get("diverged"):  # diverged before the restart: stays out
            reason = str(ended.get("failure_reason", "diverged"))
            trainers.stop(index, reason)
            trainers.diverged[index] = reason
        elif ended.get("stopped"):  # stopped at a rung before the restart
            trainers.stop(index, STOPPED_AT_RUNG)
    while trainers.training:
        metrics = trainers.train_epoch()
        for index, trial in enumerate(trainers.trials):
            slug = slugs[index]
            if index in metrics:
                cost = gpu_cost(trial, gpu_fraction)
                latest[slug] = {**metrics[index], "diverged": 0, **memory, **node, **cost}
                if population is not None:  # the settings this epoch trained with
                    latest[slug].update(trainers.trained_settings(index))
                going_on = trial.epoch < trial.config.epochs
                if (
                    judge_trials is not None
                    and going_on
                    and not judge_trials.keep(keys[index], latest[slug])
                ):
                    trainers.stop(index, STOPPED_AT_RUNG)
                    latest[slug]["stopped"] = 1
            elif index in trainers.diverged and not latest.get(slug, {}).get("diverged"):
                latest[slug] = {
                    **_totals(latest.get(slug, {})),
                    "epoch": trial.epoch + 1,
                    "val_sharpe": math.nan,
                    "diverged": 1,
                    "failure_reason": trainers.diverged[index],
                    "fell_back_to_f32": int(trial.fell_back_to_f32),
                    **node,
                    **(
                        on_board[index].reported(trained_settings(trial))
                        if on_board is not None
                        else {}
                    ),
                }
        if population is not None:
            if judge is not None and not _population_kept(judge, seed, trainers, metrics):
                # Stopped at a rung, before its exploits: its trials end on the weights
                # and settings they trained with.
                for index in trainers.stop_all(STOPPED_AT_RUNG):
                    latest[slugs[index]]["stopped"] = 1
            else:
                population.after_epoch(metrics)
            _add_lineage(latest, trainers.exploits, slugs, keys)
        if on_board is not None:  # each trial that trained this epoch
            for index in sorted(metrics):
                trial = trainers.trials[index]
                entry = on_board[index].after_epoch(trial, metrics[index])
                # The boundary's work counts in the epoch's time (charge_to_epoch): its
                # entry and GPU seconds again from the history.
                spent = {k: trial.history[-1][k] for k in _SPENT}
                latest[slugs[index]].update({**entry, **spent, **gpu_cost(trial, gpu_fraction)})
        report = {
            "epoch": max(int(m.get("epoch", 0)) for m in latest.values()),
            "val_sharpe": _best_val_sharpe(latest.values()),
            "diverged": int(all(m.get("diverged") for m in latest.values())),
            "group_size": len(slugs),
            "trials": {slug: dict(entry) for slug, entry in latest.items()},
            **memory,
            **node,
        }
        with tempfile.TemporaryDirectory(prefix="hpo-ckpt-") as tmp:
            root = Path(tmp) / CKPT_SUBDIR
            for index, trial in enumerate(trainers.trials):
                if index not in trainers.diverged:
                    meta = on_board[index].checkpoint_meta() if on_board is not None else None
                    trial.save(root / slugs[index], meta)
            ended = {s: e for s, e in latest.items() if e.get("diverged") or e.get("stopped")}
            (root / GROUP_STATE).write_text(json.dumps(ended, default=str))
            if population is not None:
                (root / POPULATION_STATE).write_text(json.dumps(population.state()))
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(tmp))


def _population_kept(
    judge: EarlyStop, population: str, trainers: Any, metrics: Mapping[int, Mapping[str, Any]]
) -> bool:
    """Whether the population that is this group trial goes on after the epoch whose
    ``metrics`` these are: the sweep's rungs asked under :func:`population_rung_key` with
    its best finite validation Sharpe this epoch (NaN where none), as Tune's ASHA would
    judge the group trial's own report. Its last epoch ends it anyway."""
    if not metrics or not trainers.training:  # its last epoch
        return True
    epoch = max(trainers.trials[index].epoch for index in metrics)
    best = _best_val_sharpe(metrics.values())
    return judge.keep(population_rung_key(population), {"epoch": epoch, "val_sharpe": best})


def _best_val_sharpe(entries: Iterable[Mapping[str, Any]]) -> float:
    """The highest finite validation Sharpe among ``entries`` (NaN where none has one):
    a group trial's own report, and what a population asks the rungs with."""
    finite = [
        float(m["val_sharpe"])
        for m in entries
        if isinstance(m.get("val_sharpe"), int | float) and math.isfinite(m["val_sharpe"])
    ]
    return max(finite, default=math.nan)


def population_rung_key(identity: str) -> str:
    """What a population that is one group trial is called at the sweep's rungs: its
    identity (its first trial's key) marked, so that it never reads as that trial's own."""
    return f"population {identity}"


def _add_lineage(
    latest: dict[str, dict[str, Any]],
    exploits: list[Any],
    slugs: list[str],
    keys: list[str],
) -> None:
    """Each trial's exploits so far in its entry: ``pbt_exploits`` (how many times it
    copied another) and ``pbt_lineage`` (one dict each: the epoch, the donor's slug and
    trial key, the settings before and after), from the group's records."""
    for index, slug in enumerate(slugs):
        if slug not in latest:
            continue
        lineage = [
            {
                "epoch": r.epoch,
                "donor": slugs[r.donor],
                "donor_key": keys[r.donor],
                "before": r.before,
                "after": r.after,
            }
            for r in exploits
            if r.recipient == index
        ]
        latest[slug]["pbt_exploits"] = len(lineage)
        latest[slug]["pbt_lineage"] = lineage


_SPENT = ("epoch_time_s", "time_s_total", "epoch_cpu_s", "cpu_s_total")
"""What a boundary's work adds to (:func:`trainables.population.charge_to_epoch`)."""

POPULATION_STATE = "population.json"  # beside the trials' checkpoints: exploits, the rng

_GroupState = tuple[list[Checkpoint | None], dict[str, dict[str, Any]], dict[str, Any] | None]


def _restore_group(slugs: list[str]) -> _GroupState:
    """Each trial's checkpoint in this group trial's newest good checkpoint (None: a
    trial that starts fresh), the final entries of trials that ended, and a population's
    saved state (:meth:`trainables.population.Population.state`; None: none saved)."""
    found = _newest_usable(lambda checkpoint: _load_group(checkpoint, slugs))
    return found if found is not None else ([None] * len(slugs), {}, None)


def _load_group(checkpoint: tune.Checkpoint, slugs: list[str]) -> _GroupState:
    with checkpoint.as_directory() as directory:
        root = Path(directory) / CKPT_SUBDIR
        ended = _read_json(root / GROUP_STATE, {})
        population = _read_json(root / POPULATION_STATE, None)
        checkpoints = [
            load_checkpoint(root / slug) if (root / slug).is_dir() else None for slug in slugs
        ]
    return checkpoints, ended, population


def _read_json(path: Path, missing: Any) -> Any:
    """A group trial's JSON state file, ``missing`` when there is none."""
    try:
        return json.loads(path.read_text()) if path.is_file() else missing
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, f"unreadable: {exc}") from exc


def _report_oom(
    config: TrainConfig,
    fraction: float,
    progress: _Progress,
    message: str,
    node: dict[str, str],
    share: GpuShare,
) -> None:
    """The share was too small: report the OOM with what ``share`` makes of it (a larger
    share for the retry). Reported, not raised: a FailureConfig retry would reuse the
    same too-small share."""
    _free_cuda_cache()
    report: dict[str, Any] = {
        "epoch": progress.epoch + 1,
        "val_sharpe": math.nan,
        "oom": 1,
        **node,
        **progress.totals,
        **progress.population,
    }
    report.update(share.after_oom(config, fraction, message))
    tune.report(report)


def _free_cuda_cache() -> None:
    """Return the failed attempt's memory to the GPU (its objects must be unreachable
    already) before the share is re-measured."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _totals(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The cost totals of a trial's last entry: a final entry (diverged, OOM) carries
    them on, so the time its epochs took still counts."""
    return {k: v for k, v in entry.items() if k.endswith("_total")}


def gpu_cost(trainer: Trainer, gpu_fraction: float) -> dict[str, float]:
    """The GPU time the trial has held so far: each epoch's seconds times the share it ran
    at (a resume may run at another share; the epoch's share is kept in the trainer's
    checkpointed history as ``epoch_gpu_s``). Ray reserves the share whether or not the
    kernels fill it, so the share, not the utilisation, is what a trial costs. Zero off
    CUDA: logical GPUs on a CPU node (tests, CPU clusters) hold no GPU. Call it once per
    epoch, after :meth:`Trainer.train_epoch`."""
    on_gpu = trainer.device.type == "cuda"
    latest = trainer.history[-1]
    latest["epoch_gpu_s"] = float(gpu_fraction) * float(latest["epoch_time_s"]) if on_gpu else 0.0
    return {
        "gpu_fraction": float(gpu_fraction) if on_gpu else 0.0,
        "gpu_s_total": sum(float(h.get("epoch_gpu_s", 0.0)) for h in trainer.history),
    }


def _report(
    trainer: Trainer, metrics: dict[str, Any], extra_meta: dict[str, Any] | None = None
) -> None:
    with tempfile.TemporaryDirectory(prefix="hpo-ckpt-") as tmp:
        trainer.save(Path(tmp) / CKPT_SUBDIR, extra_meta)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _restore_checkpoint() -> Checkpoint | None:
    """The newest good checkpoint of this trial, or None for a fresh start."""
    return _newest_usable(_load)


def _newest_usable(load: Callable[[tune.Checkpoint], _Loaded]) -> _Loaded | None:
    """``load`` of this trial's newest checkpoint that it loads without a
    :class:`CheckpointError`, or None for a fresh start (no checkpoint reported)."""
    reported = tune.get_checkpoint()
    if reported is None:
        return None
    try:
        return load(reported)
    except CheckpointError as exc:
        log.warning("newest checkpoint unusable, trying older ones: %s", exc)
    # Tune keeps the previous checkpoints beside the newest (CheckpointConfig.num_to_keep),
    # on whatever storage the sweep uses (a path or an object store: list through pyarrow).
    # Only older ones qualify: a newer directory belongs to an epoch whose result never
    # reached the driver, so resuming from it would skip that epoch's metrics.
    from pyarrow import fs as pafs

    filesystem = reported.filesystem
    trial_dir, newest = reported.path.rstrip("/").rsplit("/", 1)
    listing = filesystem.get_file_info(pafs.FileSelector(trial_dir))
    older = sorted(
        (
            info.base_name
            for info in listing
            if info.type == pafs.FileType.Directory
            and info.base_name.startswith("checkpoint_")
            and info.base_name < newest
        ),
        reverse=True,
    )
    for name in older:
        try:
            found = load(tune.Checkpoint(f"{trial_dir}/{name}", filesystem=filesystem))
        except CheckpointError as exc:
            log.warning("skipping %s", exc)
            continue
        log.warning("resuming from the previous checkpoint %s", name)
        return found
    raise CheckpointError(Path(reported.path), "no usable checkpoint for this trial")


def _load(checkpoint: tune.Checkpoint) -> Checkpoint:
    # as_directory() is the directory itself on a local path, a download otherwise; the
    # loaded checkpoint holds its tensors in memory, not the files.
    with checkpoint.as_directory() as directory:
        return load_checkpoint(Path(directory) / CKPT_SUBDIR)


def _asker(judge: EarlyStop | None, key: str) -> Callable[[Mapping[str, Any]], bool] | None:
    return None if judge is None else lambda result: judge.keep(key, result)


def _trial_id() -> str:
    """This Tune trial's id ("" outside Tune: a direct call)."""
    return str(tune.get_context().get_trial_id() or "")


def _node() -> dict[str, str]:
    import ray

    try:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:
        return {}
