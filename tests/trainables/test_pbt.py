"""Population-based training's first step: the policy (trainables/pbt.py) and the exploit
inside a group trial (TrainerGroup.exploit), in memory.

* after an exploit the recipient's folds hold the donor's weights, buffers, optimizer
  moments, step counts, guard and (bf16) Kahan compensation bit for bit, and keep their
  own minibatch order, seed and history;
* the explored lr and model settings are what the recipient's next epoch uses: it ends
  where the donor's state trained alone at the new settings ends (the restored optimizer
  state must not win over them: ray-project/ray#62173), fused or not;
* the other trials are untouched: bit-equal to a group that did not exploit;
* trials outside the fusion, and a trial copying itself, are refused;
* in a fused group the exploit copies slots within the fused tensors: it leaves bit for
  bit what the unfuse / copy / fuse path leaves (kan, liquid; f32, bf16), right after and
  one epoch later, and it unfuses, fuses, steps and writes nothing;
* the policy: quantile pairs, None scores left out, explore's ranges and replays.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from tests.trainables.helpers import (
    group_config,
    poison_slots,
    relative_difference,
    trial_weights,
)
from trainables.checkpoint import load_checkpoint
from trainables.group import TrainerGroup
from trainables.pbt import Range, choose_exploits, explore, quantile_size
from trainables.returns_file import RETURNS_FILE
from trainables.trainer import Trainer


def _optimizer_state(trainer: Trainer, fold: int) -> dict[str, dict[str, torch.Tensor]]:
    """Fold ``fold``'s optimizer state by parameter name (fused: its slot's views)."""
    run = trainer.folds[fold]
    names = {id(p): n for n, p in run.model.named_parameters()}
    return {
        names[id(p)]: {key: value.clone() for key, value in values.items()}
        for p, values in run.optimizer.state.items()
    }


def _state_equal(a: Trainer, b: Trainer) -> bool:
    """Whether every fold of ``a`` and ``b`` holds bit-equal training state."""
    for fold in range(len(a.folds)):
        ra, rb = a.folds[fold], b.folds[fold]
        sa, sb = ra.model.state_dict(), rb.model.state_dict()
        if sa.keys() != sb.keys() or not all(torch.equal(sa[n], sb[n]) for n in sa):
            return False
        oa, ob = _optimizer_state(a, fold), _optimizer_state(b, fold)
        if oa.keys() != ob.keys():
            return False
        for name, values in oa.items():
            if values.keys() != ob[name].keys():
                return False
            if not all(torch.equal(values[k], ob[name][k]) for k in values):
                return False
        ga, gb = ra.guard.state_dict(), rb.guard.state_dict()
        if not all(torch.equal(ga[k], gb[k]) for k in ga):
            return False
    return True


# --------------------------------------------------------------------------------------
# the exploit


@pytest.mark.parametrize(("family", "policy"), [("kan", "f32"), ("kan", "bf16"), ("liquid", "f32")])
def test_the_recipient_holds_the_donors_training_state_bit_for_bit(
    family: str, policy: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    poison_slots(monkeypatch, 6, slice(0, 2), range(2, 3))  # the donor skips a step
    group = TrainerGroup([group_config(family, policy, seed=s) for s in range(3)])
    group.train_epoch()
    monkeypatch.undo()
    recipient, donor = group.trials[2], group.trials[0]
    assert not _state_equal(recipient, donor)  # different seeds: different state
    generators = [run.generator.get_state() for run in recipient.folds]
    history = [dict(h) for h in recipient.history]
    settings = {**group.mutable_settings(0), "lr": 2e-3}

    record = group.exploit(2, 0, settings)

    assert _state_equal(recipient, donor)
    for fold in range(2):
        state = _optimizer_state(recipient, fold)
        assert all(int(v["step"]) == 5 for v in state.values())  # 6 steps, 1 skipped
        assert int(recipient.folds[fold].guard.skipped) == 1  # the donor's guard
        if policy == "bf16":  # the Kahan compensation came along, and it is not all zero
            compensation = [v["compensation"] for v in state.values() if "compensation" in v]
            assert compensation and any(bool(c.any()) for c in compensation)
        mine, theirs = recipient.folds[fold], donor.folds[fold]
        assert torch.equal(mine.generator.get_state(), generators[fold])  # its own order
        own = next(mine.model.parameters())
        assert own.data_ptr() != next(theirs.model.parameters()).data_ptr()  # a copy
    assert recipient.config.seed == 2 and recipient.history == history
    assert record.to_dict() == {
        "epoch": 1,
        "recipient": 2,
        "donor": 0,
        "before": group.mutable_settings(1),  # trial 1 has trial 2's old settings
        "after": settings,
    }
    assert group.exploits == [record]
    # Its latest returns were of weights it no longer holds: a checkpoint now has none.
    assert not (recipient.save(tmp_path / "after") / RETURNS_FILE).exists()
    assert (donor.save(tmp_path / "donor") / RETURNS_FILE).exists()
    assert group.fusion.fused is not None and group.fusion.fused.k == 6  # fused again
    group.train_epoch()  # it trains on, in the group
    assert recipient.epoch == 2 and len(recipient.history) == 2


@pytest.mark.parametrize("fuse", ["auto", "off"])
def test_the_explored_settings_are_what_the_next_epoch_uses(fuse: str, tmp_path: Path) -> None:
    """Trial 2 takes trial 0's state with 4x its lr and another position scale: its next
    epoch ends where trial 0's state trained alone at those settings (with trial 2's own
    minibatch order) ends, and not where it would at trial 0's lr (the optimizer's
    restored state winning over the explored settings, ray-project/ray#62173)."""
    configs = [group_config(seed=s, fuse=fuse) for s in range(3)]
    group = TrainerGroup(configs)
    assert (group.fusion.fused is None) == (fuse == "off")
    group.train_epoch()
    donor_checkpoint = load_checkpoint(group.trials[0].save(tmp_path / "donor"))
    orders = [run.generator.get_state() for run in group.trials[2].folds]
    settings = {**group.mutable_settings(0), "lr": 4e-3, "position_scale": 9.0}
    group.exploit(2, 0, settings)
    if group.fusion.fused is not None:  # the fused optimizer's lr, per slot (trial-major)
        assert group.fusion.fused.optimizer.param_groups[0]["lr"] == [1e-3] * 4 + [4e-3] * 2
    for run in group.trials[2].folds:
        assert run.optimizer.param_groups[0]["lr"] == 4e-3
        assert run.model.config.position_scale == 9.0  # type: ignore[union-attr]
    group.train_epoch()

    def donor_alone_at(lr: float) -> Trainer:
        config = configs[2].replace(
            lr=lr, fuse="off", model_config={**configs[2].model_config, "position_scale": 9.0}
        )
        alone = Trainer(config, checkpoint=donor_checkpoint)
        for run, order in zip(alone.folds, orders, strict=True):
            run.generator.set_state(order)
        alone.train_epoch()
        return alone

    explored, restored_wins = donor_alone_at(4e-3), donor_alone_at(1e-3)
    recipient = group.trials[2]
    assert relative_difference(trial_weights(explored), trial_weights(recipient)) < 1e-5
    assert relative_difference(trial_weights(restored_wins), trial_weights(recipient)) > 1e-3
    assert recipient.history[-1]["val_sharpe"] == pytest.approx(
        explored.history[-1]["val_sharpe"], abs=0.01
    )


def test_the_other_trials_are_untouched() -> None:
    """kan draws no random numbers in training: the trials that did not take part in the
    exploit, and the donor, end the next epoch bit-equal to a group that did not exploit
    (unfusing and fusing again moves their state out and back unchanged)."""
    configs = [group_config(seed=s, lr=lr) for s, lr in ((0, 1e-3), (1, 2e-3), (2, 1e-3))]
    exploiting, plain = TrainerGroup(configs), TrainerGroup(configs)
    exploiting.train_epoch()
    plain.train_epoch()
    exploiting.exploit(0, 1, {**exploiting.mutable_settings(1), "lr": 3e-3})
    exploiting.train_epoch()
    plain.train_epoch()
    for i in (1, 2):
        assert _state_equal(exploiting.trials[i], plain.trials[i]), i
        assert (
            exploiting.trials[i].history[-1]["val_sharpe"]
            == plain.trials[i].history[-1]["val_sharpe"]
        )
    assert not _state_equal(exploiting.trials[0], plain.trials[0])


def test_trials_outside_the_fusion_and_self_copies_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configs = [group_config(seed=s, fallback_after=3, log_every=3) for s in range(4)]
    poison_slots(monkeypatch, 8, slice(0, 2), range(1, 5))  # trial 0 diverges
    group = TrainerGroup(configs)
    group.train_epoch()
    monkeypatch.undo()
    group.stop(1, "asha: below the rung's cut")
    settings = group.mutable_settings(2)
    fused, weights = group.fusion.fused, trial_weights(group.trials[3]).clone()
    with pytest.raises(ValueError, match=r"trial 0 cannot be an exploit's recipient: it diverged"):
        group.exploit(0, 2, settings)
    with pytest.raises(ValueError, match=r"trial 1 cannot be an exploit's donor: it was stopped"):
        group.exploit(3, 1, settings)
    with pytest.raises(ValueError, match="trial 2 cannot exploit itself"):
        group.exploit(2, 2, settings)
    with pytest.raises(ValueError, match="sets every mutable setting"):
        group.exploit(3, 2, {"lr": 1e-3})
    assert group.fusion.fused is fused and torch.equal(trial_weights(group.trials[3]), weights)
    assert group.exploits == []
    group.train_epoch()
    with pytest.raises(ValueError, match=r"trial 3 cannot .* recipient: it is done \(all 2 epochs"):
        group.exploit(3, 2, settings)

    bf16 = TrainerGroup([group_config("kan", "bf16", seed=s) for s in range(3)])
    bf16.trials[1].fall_back_to_f32()
    with pytest.raises(ValueError, match=r"trial 1 cannot .* donor: it fell back to f32"):
        bf16.exploit(2, 1, bf16.mutable_settings(2))


# --------------------------------------------------------------------------------------
# the policy


def test_quantile_rounding_follows_ray() -> None:
    assert [quantile_size(n, 0.25) for n in range(2, 10)] == [1, 1, 1, 2, 2, 2, 2, 3]
    assert quantile_size(4, 0.5) == 2 and quantile_size(3, 0.5) == 1  # never overlapping
    with pytest.raises(ValueError, match="quantile"):
        quantile_size(4, 0.6)


def test_the_bottom_quantile_copies_the_top_quantile() -> None:
    scores: list[float | None] = [0.5, -1.0, 2.0, None, 0.1, 1.5, float("nan"), -0.3, 0.9]
    # Eligible (7): ranked worst first 1 (-1.0), 7 (-0.3), 4, 0, 8, 5, 2 (2.0); 2 per end.
    pairs = choose_exploits(scores, random.Random(0), quantile=0.25)
    assert [r for r, _ in pairs] == [1, 7]
    assert all(d in (5, 2) for _, d in pairs)
    donors = {d for seed in range(20) for _, d in choose_exploits(scores, random.Random(seed))}
    assert donors == {5, 2}  # drawn, not always the best
    assert choose_exploits(scores, random.Random(3)) == choose_exploits(scores, random.Random(3))
    # Ties rank by index, the lower index higher: 2 is the worst of three equal scores.
    assert choose_exploits([1.0, 1.0, 1.0], random.Random(0), quantile=0.25) == [(2, 0)]
    assert choose_exploits([None, 1.0, None], random.Random(0)) == []
    assert choose_exploits([], random.Random(0)) == []


LR = Range(1e-4, 1e-2, log=True)
DROPOUT = Range(0.0, 0.5)


def test_explore_perturbs_within_the_ranges() -> None:
    settings = {"lr": 1e-3, "backbone_dropout": 0.0, "n": 4.0, "kept": 7.0}
    mutations = {"lr": LR, "backbone_dropout": DROPOUT, "n": [2.0, 4.0, 8.0]}
    seen: dict[str, set[float]] = {"lr": set(), "backbone_dropout": set(), "n": set()}
    for seed in range(40):
        out = explore(settings, mutations, random.Random(seed), resample_probability=0.0)
        assert out["kept"] == 7.0
        for name in seen:
            seen[name].add(out[name])
    assert seen["lr"] == {1e-3 * 0.8, 1e-3 * 1.2}  # multiplied
    assert sorted(seen["backbone_dropout"]) == pytest.approx([0.0, 0.1])  # -0.1 clipped to 0
    assert seen["n"] == {2.0, 8.0}  # a neighbour
    top = explore({"lr": 1e-2}, {"lr": LR}, random.Random(1), resample_probability=0.0)
    assert LR.low <= top["lr"] <= LR.high
    end = {"n": 8.0}
    assert {explore(end, {"n": [2.0, 8.0]}, random.Random(s), 0.0)["n"] for s in range(10)} == {
        2.0,
        8.0,
    }


def test_explore_resamples_from_the_range_and_replays_with_the_seed() -> None:
    settings = {"lr": 1e-3, "backbone_dropout": 0.2, "n": 4.0}
    mutations = {"lr": LR, "backbone_dropout": DROPOUT, "n": [2.0, 4.0, 8.0]}
    draws = [explore(settings, mutations, random.Random(s), 1.0) for s in range(200)]
    lrs = [d["lr"] for d in draws]
    assert all(LR.low <= v <= LR.high for v in lrs)
    # Log-uniform: about half the draws below the range's geometric middle, 1e-3.
    assert 0.35 < sum(v < 1e-3 for v in lrs) / len(lrs) < 0.65
    assert all(0.0 <= d["backbone_dropout"] <= 0.5 for d in draws)
    assert {d["n"] for d in draws} == {2.0, 4.0, 8.0}
    assert draws[7] == explore(settings, mutations, random.Random(7), 1.0)
    rng = random.Random(5)
    state = rng.getstate()
    first = explore(settings, mutations, rng, 0.5)
    rng.setstate(state)
    assert explore(settings, mutations, rng, 0.5) == first
    with pytest.raises(ValueError, match=r"settings the trial does not have: \['dropout'\]"):
        explore(settings, {"dropout": DROPOUT}, rng)
    with pytest.raises(ValueError, match="log range needs low > 0"):
        explore({"x": 1.0}, {"x": Range(0.0, 1.0, log=True)}, rng)


def test_a_boundarys_exploits_copy_in_the_fused_tensors_and_refuse_before_any_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fused group's exploits unfuse nothing (they copy slots in place); a pair that
    breaks the boundary's rules is refused before any copy."""
    from trainables.fusion import Fusion

    group = TrainerGroup([group_config(seed=s, lr=1e-3 * (s + 1)) for s in range(4)])
    unfused: list[int] = []
    original = Fusion.unfuse

    def counting(self: Fusion) -> None:
        unfused.append(1)
        original(self)

    monkeypatch.setattr(Fusion, "unfuse", counting)
    weights = trial_weights(group.trials[0]).clone()
    # Trial 0 would be a recipient and a donor: refused, nothing moved or recorded.
    with pytest.raises(ValueError, match="trial 0 is a recipient and takes part in another"):
        group.exploit_all([(0, 3, group.mutable_settings(3)), (1, 0, group.mutable_settings(0))])
    assert unfused == [] and group.exploits == []
    assert torch.equal(trial_weights(group.trials[0]), weights)
    pairs = [(0, 3, group.mutable_settings(3)), (1, 2, group.mutable_settings(2))]
    records = group.exploit_all(pairs)
    assert unfused == [] and group.exploits == records
    assert [(r.recipient, r.donor, r.after) for r in records] == pairs
    assert [group.trials[i].config.lr for i in range(4)] == [4e-3, 3e-3, 3e-3, 4e-3]
    assert torch.equal(trial_weights(group.trials[0]), trial_weights(group.trials[3]))


# --------------------------------------------------------------------------------------
# the exploit in the fused tensors, against unfuse / copy / fuse

_CLOCKS = ("time", "cpu", "steps_per_s", "peak_mem")  # history entries that are timings


def _explored(group: TrainerGroup, donor: int, factor: float) -> dict[str, float]:
    """The donor's mutable settings, every one changed (a zero one made positive)."""
    return {k: v * factor if v else 0.05 * factor for k, v in group.mutable_settings(donor).items()}


def _group_state(group: TrainerGroup) -> list[tuple[str, torch.Tensor]]:
    """Every trial's every fold, by name: its module's parameters and buffers (the setting
    buffers too), optimizer state (its slot's) and guard."""
    out = []
    for i, trial in enumerate(group.trials):
        for run in trial.folds:
            tag = f"trial {i} fold {run.index}"
            named = (*run.model.named_parameters(), *run.model.named_buffers())
            out += [(f"{tag} {n}", t.detach().clone()) for n, t in named]
            for name, values in sorted(_optimizer_state(trial, run.index).items()):
                out += [(f"{tag} {name}.{key}", v) for key, v in sorted(values.items())]
            out += [(f"{tag} guard.{k}", v) for k, v in sorted(run.guard.state_dict().items())]
    return out


def _assert_bit_equal(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> None:
    assert [name for name, _ in a] == [name for name, _ in b]
    for (name, x), (_, y) in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), name


@pytest.mark.parametrize("decay", ["changed", "kept"])
@pytest.mark.parametrize("policy", ["f32", "bf16"])
@pytest.mark.parametrize("family", ["kan", "liquid"])
def test_the_fused_exploit_leaves_what_unfuse_copy_fuse_leaves(
    family: str, policy: str, decay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One boundary's two exploits (trial 3 into trial 0, whose slot 0 module is the
    stack's skeleton, and trial 2 into trial 1), every mutable setting changed (lr, the
    position scale, kan's regularization weights, liquid's dropout: setting buffers that
    now differ between slots; weight decay from 0 to one per slot, which lays the fused
    optimizer's arenas out again, or kept at 0): copied within the fused tensors, the
    group holds bit for bit what the unfuse / copy / fuse path leaves, right after and
    after one more epoch (the same kernels; the copies are exact)."""
    from trainables.stacked import StackedModules

    def run(in_place: bool) -> tuple[TrainerGroup, list[tuple[str, torch.Tensor]]]:
        with monkeypatch.context() as patch:
            if not in_place:  # no module fits the stack: the fallback path
                patch.setattr(StackedModules, "fits", lambda self, module: False)
            configs = [group_config(family, policy, seed=s, lr=1e-3 * (s + 1)) for s in range(4)]
            group = TrainerGroup(configs)
            group.train_epoch()
            fused = group.fusion.fused
            assert fused is not None and fused.k == 8
            pairs = [(0, 3, _explored(group, 3, 1.5)), (1, 2, _explored(group, 2, 0.5))]
            if decay == "kept":
                pairs = [(r, d, {**s, "weight_decay": 0.0}) for r, d, s in pairs]
            group.exploit_all(pairs)
            assert (group.fusion.fused is fused) == in_place  # fused again on the fallback
            after_exploit = _group_state(group)
            assert _state_equal(group.trials[0], group.trials[3])
            assert _state_equal(group.trials[1], group.trials[2])
            group.train_epoch()
        return group, after_exploit

    in_place, in_place_exploited = run(True)
    fallback, fallback_exploited = run(False)
    _assert_bit_equal(in_place_exploited, fallback_exploited)
    _assert_bit_equal(_group_state(in_place), _group_state(fallback))
    for a, b in zip(in_place.trials, fallback.trials, strict=True):
        assert a.config == b.config and a.model_config == b.model_config
        assert [run.model.config for run in a.folds] == [run.model.config for run in b.folds]
        assert a.epoch == b.epoch == 2 and a.global_step == b.global_step
        assert [
            {k: v for k, v in h.items() if not any(c in k for c in _CLOCKS)} for h in a.history
        ] == [{k: v for k, v in h.items() if not any(c in k for c in _CLOCKS)} for h in b.history]
    fused_a, fused_b = in_place.fusion.fused, fallback.fusion.fused
    assert fused_a is not None and fused_b is not None
    group_a, group_b = fused_a.optimizer.param_groups[0], fused_b.optimizer.param_groups[0]
    assert (group_a["lr"], group_a["weight_decay"]) == (group_b["lr"], group_b["weight_decay"])
    # One per slot since the exploit, or 0 for every slot still.
    assert isinstance(group_a["weight_decay"], list) == (decay == "changed")
    assert fused_a.model.shared_settings == fused_b.model.shared_settings
    if family == "kan":  # the regularization weights differ between slots now: vmapped
        assert "reg_lambda" not in fused_a.model.shared_settings


def _bytes_written() -> int | None:
    """The process's bytes written by write syscalls so far (Linux), else None."""
    try:
        with open("/proc/self/io") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("wchar:"))
    except OSError:
        return None


def test_the_fused_exploit_tries_no_step_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fused group's exploit neither unfuses nor fuses, tries no fused step while the
    settings every slot shares stay shared (kan's reg_lambda and reg_entropy kept), takes
    no training step, and writes no byte and no file; the next epoch trains fused."""
    import tempfile

    import trainables.fusion as fusion_module
    from trainables.fusion import Fusion

    group = TrainerGroup([group_config("kan", "bf16", seed=s, lr=1e-3 * (s + 1)) for s in range(4)])
    group.train_epoch()
    fused = group.fusion.fused
    steps: list[int] = []
    original_step = Fusion.fused_step

    def counting(self: Fusion, *args: object, **kwargs: object) -> object:
        steps.append(1)
        return original_step(self, *args, **kwargs)  # type: ignore[arg-type]

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("an in-place exploit fused, unfused, stepped or saved")

    monkeypatch.setattr(Fusion, "fused_step", counting)
    for owner, name in (
        (Fusion, "fuse"),
        (Fusion, "unfuse"),
        (fusion_module, "_try_fused_step"),
        (Trainer, "forecast_step"),
        (Trainer, "save"),
    ):
        monkeypatch.setattr(owner, name, refused)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    written = _bytes_written()
    shared = {"reg_lambda", "reg_entropy"}
    assert group.fusion.fused is not None and group.fusion.fused.model.shared_settings == shared
    kept = [
        {**_explored(group, donor, factor), **{k: group.mutable_settings(donor)[k] for k in shared}}
        for donor, factor in ((3, 1.5), (2, 0.5))
    ]
    group.exploit_all([(0, 3, kept[0]), (1, 2, kept[1])])
    if written is not None:
        assert _bytes_written() == written
    assert steps == [] and list(tmp_path.iterdir()) == []
    assert group.fusion.fused is fused
    monkeypatch.undo()
    monkeypatch.setattr(Fusion, "fused_step", counting)
    group.train_epoch()
    assert len(steps) == 6 and group.fusion.fused is fused  # 6 fused steps, no refuse


def test_an_exploit_that_unshares_a_setting_tries_a_step_and_unfuses_where_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recipient 1 takes trial 3's state with another reg_lambda, which every slot held at
    one value: the next step would take a per-slot path this stack has not run, so a
    fused step is tried (as a fuse tries one). Where it fails the group trains one after
    another, each trial holding what its slot held: the recipient its donor's weights."""
    import trainables.fusion as fusion_module

    group = TrainerGroup([group_config("kan", seed=s, lr=1e-3 * (s + 1)) for s in range(4)])
    group.train_epoch()
    tried: list[int] = []

    def failing(*args: object, **kwargs: object) -> None:
        tried.append(1)
        raise RuntimeError("a per-slot path vmap cannot batch")

    monkeypatch.setattr(fusion_module, "_try_fused_step", failing)
    donor_weights = trial_weights(group.trials[3]).clone()
    group.exploit_all([(1, 3, _explored(group, 3, 1.5))])
    assert tried == [1]
    assert group.fusion.fused is None
    assert "vmap cannot batch" in (group.fusion.unfused_reason or "")
    assert torch.equal(trial_weights(group.trials[1]), donor_weights)
    assert group.mutable_settings(1)["reg_lambda"] == pytest.approx(1.5e-4)
    monkeypatch.undo()
    metrics = group.train_epoch()  # one after another, every trial
    assert all(math.isfinite(metrics[i]["val_sharpe"]) for i in range(4))
