"""Checkpoints: bit-exact round trips, resume equals an uninterrupted run, bf16 files are
half the size, bf16 -> f32 resume, and corrupt files are named and skipped."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch

from tests.trainables.helpers import fold_weights, tiny_config
from trainables.checkpoint import (
    SCHEMA_VERSION,
    CheckpointError,
    file_size,
    latest_good_checkpoint,
    load_checkpoint,
)
from trainables.checkpoint_files import META_FILE, OPTIM_FILE, WEIGHTS_FILE
from trainables.config import DataConfig
from trainables.local import train_local
from trainables.precision import BF16, F32
from trainables.trainer import Trainer


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(precision="bf16", epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "ckpt")
    ckpt = load_checkpoint(tmp_path / "ckpt")
    for run in trainer.folds:
        for name, tensor in run.model.state_dict().items():
            saved = ckpt.weights[f"fold{run.index}.{name}"]
            assert saved.dtype == tensor.dtype
            assert torch.equal(saved, tensor), name
        for p in run.optimizer.state:
            for _key, value in run.optimizer.state[p].items():
                assert value.dtype in (F32, BF16)
    assert ckpt.meta["precision"] == "bf16" and ckpt.meta["weights_dtype"] == "bfloat16"
    restored = Trainer(tiny_config(precision="bf16", epochs=1), checkpoint=ckpt)
    restored_weights = fold_weights(restored)
    for name, tensor in fold_weights(trainer).items():
        assert torch.equal(restored_weights[name], tensor), name


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_resumed_training_equals_uninterrupted(tmp_path: Path, precision: str) -> None:
    straight = Trainer(tiny_config(precision=precision, epochs=2))
    straight.fit()

    first = Trainer(tiny_config(precision=precision, epochs=1))
    first.fit()
    first.save(tmp_path / "epoch1")
    resumed = Trainer(
        tiny_config(precision=precision, epochs=2), checkpoint=load_checkpoint(tmp_path / "epoch1")
    )
    assert resumed.epoch == 1
    resumed.fit()

    resumed_weights = fold_weights(resumed)
    for name, tensor in fold_weights(straight).items():
        assert torch.equal(resumed_weights[name], tensor), name
    assert resumed.history[-1]["val_sharpe"] == straight.history[-1]["val_sharpe"]
    assert resumed.history[-1]["train_loss"] == straight.history[-1]["train_loss"]
    assert [m["epoch"] for m in resumed.history] == [1, 2]


def test_bf16_weights_file_is_half_of_f32(tmp_path: Path) -> None:
    # d_model=64 (~330k parameters): the safetensors header (~9 KB of tensor names and
    # offsets, the same in both files) is then under 1% of the f32 file.
    sizes = {}
    for precision in ("f32", "bf16"):
        trainer = Trainer(tiny_config(precision=precision, epochs=1, model_config={"d_model": 64}))
        trainer.save(tmp_path / precision)
        sizes[precision] = file_size(tmp_path / precision, WEIGHTS_FILE)
    assert sizes["bf16"] <= 0.51 * sizes["f32"], sizes


def test_bf16_checkpoint_resumes_as_f32_with_master_weights(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(precision="bf16", epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "bf16")
    run = trainer.folds[0]
    masters = {n: run.optimizer.master_weight(p) for n, p in run.model.named_parameters()}

    resumed = Trainer(
        tiny_config(precision="f32", epochs=2), checkpoint=load_checkpoint(tmp_path / "bf16")
    )
    model = resumed.folds[0].model
    for name, p in model.named_parameters():
        assert p.dtype == F32
        assert torch.equal(p.detach(), masters[name]), name  # bf16 weight + Kahan compensation
    resumed.fit()
    assert resumed.epoch == 2 and resumed.policy.name == "f32"


def _three_epochs(tmp_path: Path) -> Path:
    run = train_local(tiny_config(epochs=3), tmp_path / "run")
    return run.out_dir / "checkpoints"


def test_truncated_weights_file_is_named_and_skipped(tmp_path: Path) -> None:
    root = _three_epochs(tmp_path)
    newest = root / "epoch_0003" / WEIGHTS_FILE
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(root / "epoch_0003")
    assert info.value.path == newest
    assert "model.safetensors" in str(info.value)

    ckpt, errors = latest_good_checkpoint(root)
    assert ckpt is not None and ckpt.epoch == 2
    assert [e.path for e in errors] == [newest]


def test_meta_without_checksums_is_refused(tmp_path: Path) -> None:
    root = _three_epochs(tmp_path)
    meta_path = root / "epoch_0003" / META_FILE
    meta = json.loads(meta_path.read_text())
    assert meta["schema_version"] == SCHEMA_VERSION
    del meta["checksums"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"epoch_0003/meta\.json: no checksums"):
        load_checkpoint(root / "epoch_0003")
    ckpt, errors = latest_good_checkpoint(root)  # resume uses the previous good one
    assert ckpt is not None and ckpt.epoch == 2 and [e.path for e in errors] == [meta_path]


def test_a_checkpoint_of_another_schema_is_refused_naming_its_meta(tmp_path: Path) -> None:
    root = _three_epochs(tmp_path)
    meta_path = root / "epoch_0003" / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = 1
    del meta["checksums"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(
        CheckpointError, match=r"epoch_0003/meta\.json: schema_version 1, this build reads 2"
    ):
        load_checkpoint(root / "epoch_0003")
    ckpt, errors = latest_good_checkpoint(root)  # resume uses the previous good one
    assert ckpt is not None and ckpt.epoch == 2 and [e.path for e in errors] == [meta_path]


def test_garbled_meta_is_named_and_resume_uses_previous(tmp_path: Path) -> None:
    root = _three_epochs(tmp_path)
    (root / "epoch_0003" / META_FILE).write_text('{"epoch": 3, "schema_ver')
    with pytest.raises(CheckpointError, match=r"epoch_0003/meta.json: not valid JSON"):
        load_checkpoint(root / "epoch_0003")
    run = train_local(None, None, resume=tmp_path / "run", epochs=4)
    assert run.resumed_from == root / "epoch_0002"
    assert [m["epoch"] for m in run.history] == [1, 2, 3, 4]
    assert len(run.skipped_checkpoints) == 1 and "meta.json" in run.skipped_checkpoints[0]


class _Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Path.touch, (Path(_Payload.marker),))

    marker = ""


def test_pickle_named_like_a_checkpoint_is_refused_unexecuted(tmp_path: Path) -> None:
    root = _three_epochs(tmp_path)
    target = root / "epoch_0003"
    _Payload.marker = str(tmp_path / "executed")
    for name in (WEIGHTS_FILE, OPTIM_FILE):
        (target / name).write_bytes(pickle.dumps(_Payload()))
    # Whoever can plant the files can rewrite meta.json too: give the pickles matching
    # checksums so that the loader actually parses them.
    meta = json.loads((target / META_FILE).read_text())
    for name in (WEIGHTS_FILE, OPTIM_FILE):
        meta["checksums"][name] = hashlib.sha256((target / name).read_bytes()).hexdigest()
    (target / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        load_checkpoint(target)
    assert not Path(_Payload.marker).exists()


def test_checkpoint_of_another_family_is_refused(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(epochs=1))
    trainer.save(tmp_path / "tft")
    with pytest.raises(CheckpointError, match="holds a 'tft' model, not 'dqn'"):
        Trainer(
            tiny_config(family="dqn", data=DataConfig(n_bars=600, n_assets=2)),
            checkpoint=load_checkpoint(tmp_path / "tft"),
        )
