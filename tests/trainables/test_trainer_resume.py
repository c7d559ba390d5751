"""Resume where the trial left off, whatever the device: generator states written on a GPU
load on a CPU, the CUDA default generator is carried, a trial that fell back to f32 stays
f32, and ``train_local`` resumes on the device it is told."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch

from models.base import Batch
from tests.trainables.helpers import fold_weights, tiny_config
from trainables.checkpoint import (
    META_FILE,
    load_checkpoint,
    portable_generator_states,
    save_checkpoint,
)
from trainables.config import DataConfig, TrainConfig
from trainables.local import train_local
from trainables.precision import BF16, F32
from trainables.trainer import Trainer


def _philox_state(seed: int, offset: int) -> torch.Tensor:
    """What ``torch.cuda.default_generators[i].get_state()`` returns: seed and offset as
    two int64, 16 bytes."""
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


def _as_if_saved_on_cuda(src: Path, dst: Path) -> int:
    """Rewrite checkpoint ``src`` into ``dst`` with every generator state CUDA-shaped."""
    ckpt = load_checkpoint(src)
    state = dict(ckpt.state)
    generators = [key for key in state if key.rsplit(".", 1)[-1] == "generator"]
    for i, key in enumerate(generators):
        state[key] = _philox_state(seed=1_000 + i, offset=4 * i)
    meta = {k: v for k, v in ckpt.meta.items() if k not in ("checksums", "schema_version")}
    meta["rng_device"] = "cuda"
    meta["cuda_rng"] = "AAAAAAAAAAAAAAAAAAAAAA=="  # 16 zero bytes: the CUDA default generator
    save_checkpoint(dst, ckpt.weights, ckpt.optim, state, meta)
    return len(generators)


RL_TINY = {"rl_iterations": 2, "data": DataConfig(n_bars=600, n_assets=2)}


@pytest.mark.parametrize(
    "config",
    [tiny_config(epochs=1), tiny_config(family="dqn", epochs=1, **RL_TINY)],
    ids=["tft", "dqn"],
)
def test_checkpoint_with_cuda_generator_states_resumes_on_cpu(
    tmp_path: Path, config: TrainConfig
) -> None:
    trainer = Trainer(config)
    trainer.fit()
    trainer.save(tmp_path / "cpu")
    n_generators = _as_if_saved_on_cuda(tmp_path / "cpu", tmp_path / "cuda")
    # tft: the fold's minibatch order; dqn also its env, learner and replay generators.
    assert n_generators == (1 if config.family == "tft" else 4)

    resumed = [
        Trainer(config.replace(epochs=2), checkpoint=load_checkpoint(tmp_path / "cuda"))
        for _ in range(2)
    ]
    for trainer in resumed:
        assert trainer.epoch == 1
        trainer.fit()
        assert trainer.epoch == 2
        assert torch.isfinite(torch.tensor(trainer.history[-1]["train_loss"]))
    # Continuing on another device is deterministic: the same checkpoint, the same numbers.
    first, second = (fold_weights(t) for t in resumed)
    for name, tensor in first.items():
        assert torch.equal(second[name], tensor), name
    assert resumed[0].history[-1]["val_sharpe"] == resumed[1].history[-1]["val_sharpe"]


class _CudaRngRecorder:
    """Device facts of a machine with CUDA in use, on a CPU-only build."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = _philox_state(seed=77, offset=4_096)
        self.restored: list[tuple[torch.Tensor, object]] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)

    def get_rng_state(self, device: object = "cuda") -> torch.Tensor:
        return self.state.clone()

    def set_rng_state(self, new_state: torch.Tensor, device: object = "cuda") -> None:
        self.restored.append((new_state.clone(), device))


def test_cuda_default_generator_is_saved_and_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _CudaRngRecorder(monkeypatch)
    trainer = Trainer(tiny_config(epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "ckpt")
    assert cuda.restored == []  # a fresh trial seeds the generator, it restores nothing

    meta = json.loads((tmp_path / "ckpt" / META_FILE).read_text())
    assert "cuda_rng" in meta
    Trainer(tiny_config(epochs=2), checkpoint=load_checkpoint(tmp_path / "ckpt"))
    assert len(cuda.restored) == 1
    assert torch.equal(cuda.restored[0][0], cuda.state)


def test_without_cuda_nothing_of_cuda_is_saved(tmp_path: Path) -> None:
    assert not torch.cuda.is_available()
    trainer = Trainer(tiny_config(epochs=1))
    trainer.save(tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / META_FILE).read_text())
    assert "cuda_rng" not in meta and meta["rng_device"] == "cpu"


def _poison(trainer: Trainer, bad: range) -> None:
    run = trainer.folds[0]
    original = run.model.loss  # type: ignore[attr-defined]
    counter = itertools.count()

    def loss(batch: Batch) -> torch.Tensor:
        value = original(batch)
        return value * float("nan") if next(counter) in bad else value

    run.model.loss = loss  # type: ignore[method-assign]


def test_fallen_back_trial_resumes_in_f32_with_its_master_weights(tmp_path: Path) -> None:
    k = 4
    config = tiny_config(
        precision="bf16", epochs=2, max_steps_per_epoch=10, fallback_after=k, log_every=5
    )
    straight = Trainer(config)
    _poison(straight, range(2, 2 + k))  # a planted divergence in the first epoch
    straight.train_epoch()
    assert straight.fell_back_to_f32 and straight.policy.name == "f32"
    straight.save(tmp_path / "epoch1")
    saved = fold_weights(straight)

    # The same config (precision = "bf16") as a Tune retry or `hpo resume` rebuilds it.
    resumed = Trainer(config, checkpoint=load_checkpoint(tmp_path / "epoch1"))
    assert resumed.policy.name == "f32" and resumed.fell_back_to_f32
    assert resumed.fallback_epoch == 1
    for run in resumed.folds:
        assert run.data.features.dtype == F32
        assert {p.dtype for p in run.model.parameters()} == {F32}
        assert all("compensation" not in s for s in run.optimizer.state.values())
    for name, tensor in fold_weights(resumed).items():
        assert tensor.dtype == saved[name].dtype
        assert torch.equal(tensor, saved[name]), name  # the f32 masters, not rounded to bf16

    # ... and it goes on exactly as the trial that never stopped.
    straight.train_epoch()
    resumed.train_epoch()
    resumed_weights = fold_weights(resumed)
    for name, tensor in fold_weights(straight).items():
        assert torch.equal(resumed_weights[name], tensor), name
    assert resumed.history[-1]["val_sharpe"] == straight.history[-1]["val_sharpe"]


def test_a_fallen_back_trial_resumed_under_another_precision_is_no_longer_fallen_back(
    tmp_path: Path,
) -> None:
    """`hpo train --resume CKPT --precision bf16-mixed` asks for a policy of its own: the
    trial runs under it, and neither its metrics nor its next checkpoint say it fell back
    (which would mark a bf16-mixed run as an f32 one in the comparison)."""
    k = 4
    config = tiny_config(precision="bf16", epochs=1, max_steps_per_epoch=10, fallback_after=k)
    trainer = Trainer(config)
    _poison(trainer, range(2, 2 + k))
    trainer.train_epoch()
    assert trainer.fell_back_to_f32
    trainer.save(tmp_path / "epoch1")
    again = dataclasses.replace(config, precision="bf16-mixed", epochs=2)
    resumed = Trainer(again, checkpoint=load_checkpoint(tmp_path / "epoch1"))
    assert resumed.policy.name == "bf16-mixed" and not resumed.fell_back_to_f32
    assert resumed.fallback_epoch is None
    assert resumed.train_epoch()["fell_back_to_f32"] == 0
    resumed.save(tmp_path / "epoch2")
    meta = json.loads((tmp_path / "epoch2" / META_FILE).read_text())
    assert not meta["fell_back_to_f32"] and meta["requested_precision"] == "bf16-mixed"


def test_bf16_trial_that_did_not_fall_back_resumes_in_bf16(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(precision="bf16", epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "ckpt")
    resumed = Trainer(
        tiny_config(precision="bf16", epochs=2), checkpoint=load_checkpoint(tmp_path / "ckpt")
    )
    assert resumed.policy.name == "bf16" and not resumed.fell_back_to_f32
    assert {p.dtype for p in resumed.folds[0].model.parameters()} == {BF16}


def test_train_local_resumes_on_the_device_it_is_given(tmp_path: Path) -> None:
    run = train_local(tiny_config(epochs=1), tmp_path / "run")
    # The trial was trained on a GPU: its saved config names one this machine lacks.
    meta_path = run.out_dir / "checkpoints" / "epoch_0001" / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["config"]["device"] = "cuda:0"
    meta_path.write_text(json.dumps(meta))

    devices: list[torch.device] = []
    resumed = train_local(
        None,
        None,
        resume=tmp_path / "run",
        epochs=2,
        device="cpu",
        on_start=lambda t: devices.append(t.device),
    )
    assert devices == [torch.device("cpu")]
    assert [m["epoch"] for m in resumed.history] == [1, 2]


def test_generator_states_of_this_device_pass_unchanged_others_are_rederived() -> None:
    cpu_state = torch.Generator().manual_seed(5).get_state()
    state = {
        "fold0.generator": cpu_state,
        "fold0.env.generator": _philox_state(seed=5, offset=0),
        "fold1.env.generator": _philox_state(seed=5, offset=8),
        "fold0.feature_mean": torch.zeros(3, dtype=torch.float64),
    }
    out = portable_generator_states(state, "cpu", saved_on="cpu")
    assert out["fold0.generator"] is cpu_state  # same device type: bit-exact resume
    assert out["fold0.feature_mean"] is state["fold0.feature_mean"]
    rederived = [out["fold0.env.generator"], out["fold1.env.generator"]]
    for s in rederived:
        torch.Generator().set_state(s)  # loadable on the CPU
    assert not torch.equal(*rederived)  # another offset, another stream
    again = portable_generator_states(state, "cpu", saved_on="cpu")
    assert torch.equal(again["fold1.env.generator"], out["fold1.env.generator"])  # deterministic
    # A CPU-shaped state recorded as saved on another device type is re-derived too.
    assert not torch.equal(
        portable_generator_states(state, "cpu", saved_on="mps")["fold0.generator"], cpu_state
    )
