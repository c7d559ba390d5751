"""The sweep's Tune trainable as the driver names it: :func:`run_trial` imports the trial
loop (the trainer, torch) where it runs, in the trial's worker, so the driver that hands
it to Tune imports no torch (a sweep's fixed cost: bench/README.md, "A sweep's fixed
cost")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainables.trial import EarlyStop, Exchange, GpuShare


def run_trial(
    config: dict[str, Any],
    share: GpuShare | None = None,
    judge: EarlyStop | None = None,
    exchange: Exchange | None = None,
) -> None:
    """:func:`trainables.trial.run_trial`, imported on the first call (Tune knows the
    trainable by this function's name, the same as before it moved here, so a sweep
    started by an earlier version resumes)."""
    from trainables.memory import imports_without_collection

    with imports_without_collection():  # torch, Tune and the trainer: 0.45 s less
        from trainables.trial import run_trial as train

    train(config, share, judge, exchange)
