"""A population across processes (trainables/population.py ``PopulationTrial``, and
``Trainer.take_checkpoint_state``), without Ray: each trial a trainer of its own, the
board (hpo/population_board.py) called in process.

* an exploit from the donor's boundary checkpoint leaves the recipient in the state the in-memory
  exploit leaves it in (weights, moments, bf16 compensation, guard), and the next epoch
  trains the same, f32 and bf16 (both paths run the same kernels here: bit for bit);
* the explored lr is what the recipient's optimizer uses, not the donor's
  (ray-project/ray#62173), while the recipient keeps its own identity (minibatch order,
  epoch, history);
* an RL family (dqn) exploits too, keeping its own environments and replay;
* a trial that fell back to f32 posts no score.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hpo.population_board import PopulationBoard, PopulationExchange
from tests.trainables.helpers import group_config, tiny_config, trial_weights
from trainables.checkpoint import load_checkpoint
from trainables.group import mutable_settings, trained_settings, with_settings
from trainables.pbt import PbtSettings, Range
from trainables.population import PopulationTrial
from trainables.trainer import Trainer

PBT = PbtSettings(
    interval_epochs=1,
    quantile=0.5,
    resample_probability=0.0,
    mutations={"lr": Range(1e-5, 1e-1, log=True)},
)


class InProcessExchange(PopulationExchange):
    """The sweep's exchange with its board in this process instead of a Ray actor."""

    def __init__(self, sweep_dir: Path) -> None:
        super().__init__("test", str(sweep_dir))
        self.board = PopulationBoard(str(sweep_dir))

    def at_boundary(self, population: str, pbt: Any, **report: Any) -> dict | None:
        return self.board.at_boundary(population, pbt, **report)


def _optimizer_state(trainer: Trainer) -> list[torch.Tensor]:
    return [
        value.float().flatten()
        for run in trainer.folds
        for p in run.model.parameters()
        for value in run.optimizer.state[p].values()
        if isinstance(value, torch.Tensor)
    ]


@pytest.mark.parametrize(
    ("precision", "n_folds"),
    [("f32", 1), ("bf16", 1), ("f32", 2)],  # 2 folds train fused: re-fused after the copy
)
def test_an_exploit_from_a_checkpoint_equals_the_in_memory_exploit(
    tmp_path: Path, precision: str, n_folds: int
) -> None:
    def pair() -> tuple[Trainer, Trainer]:
        recipient = Trainer(group_config("kan", precision, seed=0, lr=1e-4, n_folds=n_folds))
        donor = Trainer(group_config("kan", precision, seed=1, lr=3e-3, n_folds=n_folds))
        recipient.train_epoch()
        donor.train_epoch()
        return recipient, donor

    settings = {**mutable_settings(pair()[1]), "lr": 2e-3}
    # In memory: both trainers unfused, the donor's state copied (a group's fallback path).
    memory, donor = pair()
    memory.fusion.unfuse()
    donor.fusion.unfuse()
    memory.take_training_state(donor, with_settings(memory.config, settings))
    memory.fusion.fuse_again()
    # Through the donor's checkpoint, as a trial in another Tune trial reads it.
    from_file, donor = pair()
    donor.save(tmp_path / "donor")
    own_generator = from_file.folds[0].generator.get_state()
    from_file.take_checkpoint_state(
        load_checkpoint(tmp_path / "donor"), with_settings(from_file.config, settings)
    )

    # Bit for bit on any processor: both are copies of the same tensors, and the epoch
    # after runs the same kernels on both (the same fusion of the same shapes).
    assert torch.equal(trial_weights(from_file), trial_weights(memory))
    assert torch.equal(trial_weights(from_file), trial_weights(donor))
    for a, b in zip(_optimizer_state(from_file), _optimizer_state(memory), strict=True):
        assert torch.equal(a, b)
    # The explored lr trains (in the fused optimizer's slots where the folds fuse), not
    # the donor's nor the trial's own; the trial keeps its own minibatch order.
    assert trained_settings(from_file)["lr"] == 2e-3 == from_file.config.lr
    assert (from_file.fused is not None) == (n_folds > 1)
    assert torch.equal(from_file.folds[0].generator.get_state(), own_generator)
    assert from_file.epoch == 1 and len(from_file.history) == 1
    after_memory, after_file = memory.train_epoch(), from_file.train_epoch()
    assert after_file["val_sharpe"] == after_memory["val_sharpe"]
    assert torch.equal(trial_weights(from_file), trial_weights(memory))


def test_trials_of_a_population_exploit_through_the_board(tmp_path: Path) -> None:
    exchange = InProcessExchange(tmp_path)
    lrs = (1e-4, 3e-3)
    trainers = [
        Trainer(group_config("kan", seed=s, lr=lr, n_folds=1, epochs=3)) for s, lr in enumerate(lrs)
    ]
    members = [
        PopulationTrial(exchange, PBT, "kan-f32-c000", f"kan-f32-c00{i}|f32/{i}", f"trial{i}")
        for i in range(2)
    ]
    scores = [trainer.train_epoch() for trainer in trainers]
    # The better trial reaches the boundary first: nobody to rank against, it trains
    # on. The worse one ranks among both and, at quantile 0.5, copies the better.
    better, worse = sorted(range(2), key=lambda i: -scores[i]["val_sharpe"])
    first = members[better].after_epoch(trainers[better], scores[better])
    second = members[worse].after_epoch(trainers[worse], scores[worse])
    assert first["pbt_exploits"] == 0
    (exploit,) = second["pbt_lineage"]
    assert (exploit["epoch"], exploit["donor"], exploit["donor_key"]) == (
        1,
        f"trial{better}",
        f"kan-f32-c00{better}|f32/{better}",
    )
    assert torch.equal(trial_weights(trainers[worse]), trial_weights(trainers[better]))
    assert trainers[worse].folds[0].optimizer.param_groups[0]["lr"] == exploit["after"]["lr"]
    # What the worse one's epoch 1 trained with is what it reports, and its "before".
    assert exploit["before"]["lr"] == lrs[worse] == second["lr"]
    # Asked again (an epoch re-run after a resume): the same answer, nothing new drawn.
    again = exchange.board.at_boundary(
        "kan-f32-c000",
        PBT.to_dict(),
        trial=f"kan-f32-c00{worse}|f32/{worse}",
        trial_id=f"trial{worse}",
        epoch=1,
        score=-99.0,
        settings={},
        checkpoint="elsewhere",
    )
    assert again is not None and again["after"] == exploit["after"]
    assert exchange.board.exploits() == 1
    # Boundary checkpoints under the sweep directory, one per trial and attempt, in the
    # layout `hpo train --resume` reads.
    for i in range(2):
        (saved,) = (tmp_path / "pbt" / "kan-f32-c000" / f"kan-f32-c00{i}_f32_{i}").glob("epoch-1-*")
        assert load_checkpoint(saved).meta["epoch"] == 1


def test_an_rl_trial_takes_the_donors_networks_and_keeps_its_own_replay(tmp_path: Path) -> None:
    config = {"n_folds": 1, "max_steps_per_epoch": 4, "epochs": 2}
    recipient = Trainer(tiny_config("dqn", seed=0, lr=1e-4, **config))
    donor = Trainer(tiny_config("dqn", seed=1, lr=1e-3, **config))
    recipient.train_epoch()
    donor.train_epoch()
    donor.save(tmp_path / "donor")
    buffer = {k: v.clone() for k, v in recipient.folds[0].model.buffer_state().items()}  # type: ignore[operator]
    env = {k: v.clone() for k, v in recipient.folds[0].env.state_dict().items()}  # type: ignore[union-attr]
    settings = {**mutable_settings(recipient), "lr": 5e-4}
    recipient.take_checkpoint_state(
        load_checkpoint(tmp_path / "donor"), with_settings(recipient.config, settings)
    )
    run = recipient.folds[0]
    assert torch.equal(trial_weights(recipient), trial_weights(donor))
    # Only the online network's parameters train (the target network follows them).
    trainable = set(map(id, run.model.trainable_parameters()))  # type: ignore[operator]
    assert {id(p) for g in run.optimizer.param_groups for p in g["params"]} == trainable
    assert run.optimizer.param_groups[0]["lr"] == 5e-4
    for key, value in run.model.buffer_state().items():  # type: ignore[operator]
        assert torch.equal(value, buffer[key])
    for key, value in run.env.state_dict().items():  # type: ignore[union-attr]
        assert torch.equal(value, env[key])
    recipient.train_epoch()  # trains on from there
    assert recipient.epoch == 2


def test_a_trial_that_fell_back_to_f32_posts_no_score(tmp_path: Path) -> None:
    posted: list[dict[str, Any]] = []

    class Recording(InProcessExchange):
        def at_boundary(self, population: str, pbt: Any, **report: Any) -> dict | None:
            posted.append(report)
            return super().at_boundary(population, pbt, **report)

    trainer = Trainer(group_config("kan", seed=0, n_folds=1, epochs=3))
    metrics = trainer.train_epoch()
    trainer.fell_back_to_f32 = True
    PopulationTrial(Recording(tmp_path), PBT, "p", "m", "t").after_epoch(trainer, metrics)
    assert posted[0]["score"] is None


def test_a_checkpoint_of_another_precision_is_refused(tmp_path: Path) -> None:
    donor = Trainer(group_config("kan", "bf16", seed=1, n_folds=1))
    donor.save(tmp_path / "donor")
    recipient = Trainer(group_config("kan", "f32", seed=0, n_folds=1))
    before = trial_weights(recipient).clone()
    with pytest.raises(ValueError, match="kan/bf16 checkpoint into a kan/f32 trial"):
        recipient.take_checkpoint_state(load_checkpoint(tmp_path / "donor"), recipient.config)
    assert torch.equal(trial_weights(recipient), before)


def test_two_group_trials_of_one_population_meet_on_the_board(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A population of four kan trials in two group trials of two (as the searcher makes
    a population larger than a group): each group trial's trials post to the board and
    exploit from any trial's boundary checkpoint, run as Tune runs them (``run_trial``
    with the sweep's exchange). The second group trial, dying after its second boundary's
    answer but before that epoch's report, and resumed, makes the exploits it made
    uninterrupted (a fresh board directory for each run), none twice, none lost."""
    from ray import tune

    from tests.hpo.sweep_helpers import tiny_spec
    from trainables import trial as trial_module
    from trainables.config import GroupTrialConfig, TrialConfig

    spec = tiny_spec(
        tmp_path,
        families=["kan"],
        precisions=["f32"],
        max_epochs=3,
        search_space={"kan": {"width": 4}},
    )
    # On this tiny task lr 3e-2 scores best after epoch 1 (-1.1) and 1e-2 worst (-2.7);
    # the others -2.26: the second group trial's last trial is the population's worst.
    lrs = (1e-4, 3e-2, 3e-4, 1e-2)
    trials = [
        TrialConfig(
            family="kan",
            precision="f32",
            seed=0,
            params={"width": 4, "lr": lr},
            base=spec.trial_base(),
            config_id=f"kan-f32-c00{i}",
            pair_id=f"kan-f32-c00{i}-s0",
        )
        for i, lr in enumerate(lrs)
    ]
    settings = PbtSettings(1, 0.25, 0.0, {"lr": Range(1e-5, 1e-1, log=True)})
    groups = [
        GroupTrialConfig(tuple(trials[:2]), pbt=settings, population="kan-f32-c000"),
        GroupTrialConfig(tuple(trials[2:]), pbt=settings, population="kan-f32-c000"),
    ]

    class Lost(Exception):
        """The process died before Tune saved this report and its checkpoint."""

    def run_group(
        g: int, folder: Path, exchange: InProcessExchange, lose_report: int | None = None
    ) -> list[dict[str, Any]]:
        """Group trial ``g`` through ``run_trial`` as Tune runs it, with Tune's report
        and checkpoint played by a folder of checkpoint_<n> copies; report number
        ``lose_report`` is lost with its checkpoint (the run ends there)."""
        reported: list[dict[str, Any]] = []

        def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
            if lose_report is not None and len(reported) + 1 == lose_report:
                raise Lost
            index = len(sorted(folder.glob("checkpoint_*")))
            shutil.copytree(checkpoint.path, folder / f"checkpoint_{index:06d}")
            reported.append(metrics)

        def newest() -> Any:
            found = sorted(folder.glob("checkpoint_*"))
            return tune.Checkpoint(str(found[-1])) if found else None

        monkeypatch.setattr(tune, "report", report)
        monkeypatch.setattr(tune, "get_checkpoint", newest)
        monkeypatch.setattr(trial_module, "_trial_id", lambda: f"group{g}")
        monkeypatch.setattr(trial_module, "_node", dict)  # no Ray here
        with contextlib.suppress(Lost):
            trial_module.run_trial(groups[g].to_dict(), exchange=exchange)
        monkeypatch.undo()
        return reported

    def run_both(root: Path, interrupt: bool) -> tuple[InProcessExchange, dict[str, Any]]:
        exchange = InProcessExchange(root / "sweep")
        final: dict[str, Any] = {}
        for g in range(2):
            folder = root / f"group{g}"
            folder.mkdir(parents=True)
            if interrupt and g == 1:
                # Epoch 2's boundary is posted and its exploit made, then the report is
                # lost: the resumed run trains epoch 2 again and asks the (restarted)
                # board again, which answers as it did.
                run_group(g, folder, exchange, lose_report=2)
                exchange.board = PopulationBoard(str(root / "sweep"))
            final.update(run_group(g, folder, exchange)[-1]["trials"])
        return exchange, final

    exchange, final = run_both(tmp_path / "whole", interrupt=False)
    decided = {
        k: v for k, v in exchange.board.populations["kan-f32-c000"]["decisions"].items() if v
    }
    assert len(exchange.board.populations["kan-f32-c000"]["decisions"]) == 8  # 4 x 2
    assert decided, "nobody exploited: the test would show nothing"
    lineage = sorted(
        (e["epoch"], e["donor_trial_id"], e["after"]["lr"])
        for entry in final.values()
        for e in entry["pbt_lineage"]
    )
    assert lineage == sorted((v["epoch"], v["donor"], v["after"]["lr"]) for v in decided.values())
    # A trial of the second group trial copied one of the first's: across Tune trials.
    assert any(v["donor"].startswith("group0-") for k, v in decided.items() if "c003" in k)

    cut, resumed = run_both(tmp_path / "cut", interrupt=True)

    def answers(board: PopulationBoard) -> dict[str, Any]:  # where checkpoints lie aside
        decisions = board.populations["kan-f32-c000"]["decisions"]
        return {k: v and {**v, "checkpoint": None} for k, v in decisions.items()}

    assert answers(cut.board) == answers(exchange.board)  # every answer, once
    for slug, entry in final.items():
        assert resumed[slug]["pbt_lineage"] == entry["pbt_lineage"], slug
        assert resumed[slug]["lr"] == entry["lr"]


def test_a_boundarys_work_counts_in_the_epochs_time(tmp_path: Path) -> None:
    """The boundary checkpoint, the post and an exploit take time after the epoch's
    clock stopped; they count in that epoch's time and the trial's totals (what hpo
    status's hours and the GPU share's seconds read), and in every later total."""
    pause = 0.2

    class Slow(InProcessExchange):
        def save_boundary_checkpoint(self, *args: Any, **kwargs: Any) -> str:
            time.sleep(pause)  # a slow disk or upload
            return super().save_boundary_checkpoint(*args, **kwargs)

    trainer = Trainer(group_config("kan", seed=0, n_folds=1, epochs=3))
    metrics = trainer.train_epoch()
    epoch, total = metrics["epoch_time_s"], metrics["time_s_total"]
    PopulationTrial(Slow(tmp_path), PBT, "p", "k", "t").after_epoch(trainer, metrics)
    assert trainer.history[-1] is metrics  # the dict the report and later totals read
    assert metrics["epoch_time_s"] >= epoch + pause and metrics["time_s_total"] >= total + pause
    following = trainer.train_epoch()
    assert following["time_s_total"] == pytest.approx(
        metrics["time_s_total"] + following["epoch_time_s"]
    )
