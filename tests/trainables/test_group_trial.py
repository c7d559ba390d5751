"""A group trial under Ray Tune (trainables.trial with a GroupTrialConfig): every trial's
metrics each epoch, its own checkpoint, and a row of its own in hpo.trials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpo.trials import trial_rows
from tests.hpo.sweep_helpers import tiny_spec
from trainables.checkpoint import load_checkpoint
from trainables.config import GroupTrialConfig, TrialConfig, trial_slug
from trainables.trainer import Trainer


def _group(tmp_path: Path, seeds: tuple[int, ...]) -> GroupTrialConfig:
    spec = tiny_spec(
        tmp_path,
        families=["kan"],
        precisions=["f32"],
        search_space={"kan": {"width": 4}},
        walk_forward={"n_folds": 2},
    )
    base = spec.trial_base()
    trials = tuple(
        TrialConfig(
            family="kan",
            precision="f32",
            seed=seed,
            params={"width": 4},
            base=base,
            config_id="kan-c000",
            pair_id=f"kan-c000-s{seed}",
        )
        for seed in seeds
    )
    return GroupTrialConfig(trials)


def test_a_group_trial_reports_and_checkpoints_every_trial(
    ray_session: Any, tmp_path: Path, mlflow_uri: str
) -> None:
    from mlflow.tracking import MlflowClient
    from ray import tune

    from hpo.tracking import MlflowSweepCallback, start_sweep_run
    from tests.hpo.sweep_helpers import trial_runs
    from trainables.trial import run_trial

    group = _group(tmp_path, (0, 1, 2))
    client = MlflowClient(mlflow_uri)
    parent = start_sweep_run(client, "g", {"name": "g"}, compare=False)
    callback = MlflowSweepCallback(mlflow_uri, "g", parent)
    tuner = tune.Tuner(
        tune.with_resources(run_trial, {"cpu": 1}),
        param_space=group.to_dict(),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"), name="g", verbose=0, callbacks=[callback]
        ),
    )
    result = tuner.fit()[0]
    assert result.error is None
    last = result.metrics
    assert last["group_size"] == 3 and set(last["trials"]) == {"f32-s0", "f32-s1", "f32-s2"}
    assert all(m["epoch"] == 2 and m["diverged"] == 0 for m in last["trials"].values())
    assert last["val_sharpe"] == max(m["val_sharpe"] for m in last["trials"].values())

    rows = sorted(trial_rows(tmp_path / "tune" / "g"), key=lambda r: r.seed)
    assert [r.seed for r in rows] == [0, 1, 2]
    assert [f"{r.precision}/{r.seed}" for r in rows] == ["f32/0", "f32/1", "f32/2"]
    for row, trial in zip(rows, group.trials, strict=True):
        slug = trial_slug(trial.precision, trial.seed)
        assert row.trial_id.endswith(slug) and row.epochs == 2
        assert row.val_sharpe == pytest.approx(last["trials"][slug]["val_sharpe"])
        assert row.checkpoint is not None
        # A trial's checkpoint is an ordinary trial checkpoint: it resumes alone.
        alone = Trainer(trial.train_config(), checkpoint=load_checkpoint(Path(row.checkpoint)))
        assert alone.epoch == 2 and alone.config.seed == trial.seed

    # One MLflow child run per trial, tagged as a trial of its own, each epoch once.
    assert callback.flush(60)
    runs = sorted(trial_runs(mlflow_uri, "g"), key=lambda r: int(r.data.tags["seed"]))
    assert [r.data.tags["seed"] for r in runs] == ["0", "1", "2"]
    for run, row in zip(runs, rows, strict=True):
        tags = run.data.tags
        assert tags["trial_id"] == row.trial_id and tags["precision"] == row.precision
        assert tags["pair_id"] == f"kan-c000-s{row.seed}" and tags["family"] == "kan"
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "val_sharpe")
        assert [m.step for m in history] == [1, 2]
        assert history[-1].value == pytest.approx(row.val_sharpe)
        returns = {a.path for a in client.list_artifacts(run.info.run_id, "returns")}
        assert returns == {"returns/returns.csv"}


def test_a_trial_stopped_at_a_rung_leaves_the_group_and_keeps_its_run(
    ray_session: Any, tmp_path: Path, mlflow_uri: str
) -> None:
    # Two configurations of one shape (lr differs) in one group; the judge (the sweep's
    # per-trial ASHA) stops one trial after epoch 1: it trains no more, its entry and
    # checkpoint stay those of epoch 1, its run finishes, the others train to epoch 2.
    import json

    from mlflow.tracking import MlflowClient
    from ray import tune

    from hpo.tracking import MlflowSweepCallback, start_sweep_run
    from tests.hpo.sweep_helpers import trial_runs
    from trainables.trial import run_trial

    seeded = _group(tmp_path, (0, 1)).trials
    other = TrialConfig.from_dict(
        {**seeded[0].to_dict(), "config_id": "kan-c001", "params": {"width": 4, "lr": 3e-3}}
    )
    group = GroupTrialConfig((seeded[0], other, seeded[1]))
    asked = tmp_path / "asked.jsonl"
    stop = "kan-c001|f32/0"

    class Judge:
        def keep(self, trial: str, result: Any) -> bool:
            with asked.open("a") as out:
                out.write(json.dumps([trial, result["epoch"]]) + "\n")
            return trial != stop

    client = MlflowClient(mlflow_uri)
    parent = start_sweep_run(client, "rungs", {"name": "rungs"}, compare=False)
    callback = MlflowSweepCallback(mlflow_uri, "rungs", parent)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_trial, judge=Judge()), {"cpu": 1}),
        param_space=group.to_dict(),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"), name="rungs", verbose=0, callbacks=[callback]
        ),
    )
    result = tuner.fit()[0]
    assert result.error is None
    trials = result.metrics["trials"]
    assert set(trials) == {"c000-f32-s0", "c001-f32-s0", "c000-f32-s1"}
    assert trials["c001-f32-s0"]["epoch"] == 1 and trials["c001-f32-s0"]["stopped"] == 1
    assert [trials[s]["epoch"] for s in ("c000-f32-s0", "c000-f32-s1")] == [2, 2]
    # Asked once per trial after epoch 1; not after the last epoch (it ends there anyway).
    calls = sorted(tuple(json.loads(line)) for line in asked.read_text().splitlines())
    assert calls == [("kan-c000|f32/0", 1), ("kan-c000|f32/1", 1), ("kan-c001|f32/0", 1)]

    rows = trial_rows(tmp_path / "tune" / "rungs")
    stopped_row = next(r for r in rows if r.config_id == "kan-c001")
    assert stopped_row.epochs == 1 and stopped_row.checkpoint is not None
    alone = Trainer(other.train_config(), checkpoint=load_checkpoint(Path(stopped_row.checkpoint)))
    assert alone.epoch == 1 and alone.config.lr == pytest.approx(3e-3)

    assert callback.flush(60)
    runs = {r.data.tags["trial_id"]: r for r in trial_runs(mlflow_uri, "rungs")}
    assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs.values())
    steps = {
        trial_id: [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
        for trial_id, run in runs.items()
    }
    assert steps[stopped_row.trial_id] == [1]
    assert sorted(len(s) for s in steps.values()) == [1, 2, 2]


def test_a_corrupt_newest_group_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A group trial restarted (a retry, or a resume) whose newest checkpoint has a trial's
    # weights truncated: every trial resumes from the previous checkpoint, as a trial
    # alone does, and the group's ended trials come from that checkpoint too.
    from ray import tune

    from trainables import trial as trial_module
    from trainables.group import TrainerGroup

    group = _group(tmp_path, (0, 1))
    slugs = group.slugs()
    trainers = TrainerGroup(group.train_configs())
    trial_dir = tmp_path / "trial"
    for epoch in (1, 2):
        trainers.train_epoch()
        root = trial_dir / f"checkpoint_{epoch - 1:06d}" / trial_module.CKPT_SUBDIR
        for trial, slug in zip(trainers.trials, slugs, strict=True):
            trial.save(root / slug)
        (root / trial_module.GROUP_STATE).write_text("{}")
    newest = trial_dir / "checkpoint_000001"
    weights = newest / trial_module.CKPT_SUBDIR / slugs[1] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(tune, "get_checkpoint", lambda: tune.Checkpoint(str(newest)))

    checkpoints, ended, population = trial_module._restore_group(slugs)
    assert ended == {} and population is None
    resumed = [
        Trainer(m.train_config(), checkpoint=c)
        for m, c in zip(group.trials, checkpoints, strict=True)
    ]
    assert [t.epoch for t in resumed] == [1, 1]

    # With no good checkpoint left the restart fails, naming the trial's checkpoints.
    older = trial_dir / "checkpoint_000000" / trial_module.CKPT_SUBDIR / trial_module.GROUP_STATE
    older.write_text("{not json")
    with pytest.raises(trial_module.CheckpointError, match="no usable checkpoint"):
        trial_module._restore_group(slugs)


def test_a_trial_restarted_at_the_epoch_a_rung_stopped_it_trains_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trial alone asks the rungs before reporting each epoch; if the sweep's snapshot
    # saw that epoch's checkpoint but not the trial's end, the restart resumes there: it
    # asks again (the rungs remember) and ends without training or reporting.
    from ray import tune

    from trainables import trial as trial_module

    trial = _group(tmp_path, (0,)).trials[0]
    config = trial.train_config()
    trainer = Trainer(config)
    trainer.train_epoch()
    root = tmp_path / "trial" / "checkpoint_000000"
    trainer.save(root / trial_module.CKPT_SUBDIR)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: tune.Checkpoint(str(root)))
    reported: list[dict[str, Any]] = []
    monkeypatch.setattr(tune, "report", lambda metrics, **_: reported.append(metrics))
    asked: list[int] = []

    def keep(result: Any) -> bool:
        asked.append(int(result["epoch"]))
        return False

    progress = trial_module._Progress()
    trial_module._train(config, {}, {}, progress, 0.0, keep)
    assert asked == [1] and reported == [] and progress.epoch == 1
    # Kept instead: it trains on from epoch 2 and asks after each epoch but the last.
    trial_module._train(config, {}, {}, trial_module._Progress(), 0.0, lambda r: True)
    assert [r["epoch"] for r in reported] == [2]


def test_an_oom_in_a_group_reports_every_training_trial_and_keeps_the_ended_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three trials; the judge stops one after epoch 1; epoch 2 runs out of GPU memory.
    # The OOM is the group's share's fault: asked once, for the group's shape (3 trials),
    # and every trial still training reports it with the retry share; the stopped
    # trial's final entry stands. Reported, not raised (a Tune retry would reuse the share).
    import torch
    from ray import tune

    from trainables import trial as trial_module
    from trainables.group import TrainerGroup

    group = _group(tmp_path, (0, 1, 2))
    monkeypatch.setattr(tune, "get_checkpoint", lambda: None)
    reported: list[dict[str, Any]] = []
    monkeypatch.setattr(tune, "report", lambda metrics, **_: reported.append(metrics))
    original = TrainerGroup.train_epoch

    def train_epoch(self: TrainerGroup) -> Any:
        if self.epoch == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")
        return original(self)

    monkeypatch.setattr(TrainerGroup, "train_epoch", train_epoch)
    asked: list[tuple[str, float, int]] = []

    class Share:
        def cap_memory(self, config: Any, fraction: float, group_size: int = 1) -> None:
            return None

        def memory_metrics(self, config: Any, fraction: float, group_size: int = 1) -> dict:
            return {}

        def after_oom(
            self, config: Any, fraction: float, message: str, group_size: int = 1
        ) -> dict:
            asked.append((message, fraction, group_size))
            return {"oom_retry_gpu_fraction": 0.4, "failure_reason": f"OOM: {message}"}

    class Judge:
        def keep(self, trial: str, result: Any) -> bool:
            return trial != "kan-c000|f32/1"

    trial_module._train_group(group, 0.2, Share(), Judge())
    assert asked == [("CUDA out of memory (planted)", 0.2, 3)]
    first, last = reported
    assert set(first["trials"]) == {"f32-s0", "f32-s1", "f32-s2"} and first["epoch"] == 1
    assert last["oom"] == 1 and last["oom_retry_gpu_fraction"] == 0.4
    trials = last["trials"]
    assert trials["f32-s1"] == first["trials"]["f32-s1"]  # stopped at epoch 1: stands
    assert trials["f32-s1"]["stopped"] == 1 and "oom" not in trials["f32-s1"]
    for slug in ("f32-s0", "f32-s2"):
        entry = trials[slug]
        assert (entry["oom"], entry["epoch"], entry["oom_retry_gpu_fraction"]) == (1, 2, 0.4)
        assert entry["time_s_total"] == first["trials"][slug]["time_s_total"]  # time spent
    # Without a share (a direct call) the OOM is raised, as for a trial alone.
    with pytest.raises(torch.cuda.OutOfMemoryError):
        trial_module._train_group(group, 0.2, None)
