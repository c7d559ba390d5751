"""A small sweep end to end on the session's local Ray: MLflow holds one nested child run
per trial with tags, params and per-epoch metrics; checkpoints are safetensors in the
trial's dtype; `hpo status` / `hpo best` read the sweep; a best checkpoint continues alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from safetensors import safe_open
from typer.testing import CliRunner

from hpo.cli import app
from hpo.record import SweepError, SweepRecord
from hpo.sweep import run_sweep
from hpo.tracking import TAG_PARENT, TAG_ROLE
from hpo.trials import trial_rows
from tests.hpo.sweep_helpers import tiny_spec
from trainables.data import synthetic_bars

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EXPECTED_DTYPE = {"f32": "F32", "bf16": "BF16"}


READ_FROM_STORAGE: list[str] = []  # what finish_sweep read back with trial_rows


@pytest.fixture(scope="module")
def finished_sweep(ray_session, tmp_path_factory):  # type: ignore[no-untyped-def]
    import hpo.sweep

    tmp = tmp_path_factory.mktemp("sweep")
    spec = tiny_spec(tmp)
    with pytest.MonkeyPatch.context() as patch:
        read = hpo.sweep.trial_rows
        patch.setattr(
            hpo.sweep,
            "trial_rows",
            lambda where: READ_FROM_STORAGE.append(str(where)) or read(where),
        )
        rows = run_sweep(spec)
    return spec, rows, Path(spec.storage) / spec.name


def test_the_summary_rows_are_the_trials_tune_held_and_what_storage_holds(finished_sweep) -> None:  # type: ignore[no-untyped-def]
    """The sweep's end takes its rows from the trials Tune held (not read back from the
    sweep's storage), and they are the rows `hpo status` reads from storage."""
    _, rows, sweep_dir = finished_sweep
    assert READ_FROM_STORAGE == []
    by_id = {r.trial_id: r for r in trial_rows(sweep_dir)}
    assert sorted(by_id) == sorted(r.trial_id for r in rows)
    for row in rows:
        assert row == by_id[row.trial_id]


def test_the_saved_experiment_state_holds_no_last_n_windows(finished_sweep) -> None:  # type: ignore[no-untyped-def]
    """The sweep drops a completed trial's last-n windows (hpo.ended_trials) before Tune's
    last snapshot, and keeps the per-metric analysis."""
    spec, _, sweep_dir = finished_sweep
    state = json.loads(max(sweep_dir.glob("experiment_state-*.json")).read_text())
    assert len(state["trial_data"]) == spec.n_trials
    for _, metadata in state["trial_data"]:
        saved = json.loads(metadata)
        assert saved["metric_n_steps"] == {}
        last = saved["metric_analysis"]["val_sharpe"]["last"]
        assert last == pytest.approx(saved["last_result"]["val_sharpe"], nan_ok=True)


def test_every_trial_is_a_nested_child_run(finished_sweep) -> None:  # type: ignore[no-untyped-def]
    spec, rows, sweep_dir = finished_sweep
    assert len(rows) == spec.n_trials == 4
    assert all(r.status == "TERMINATED" for r in rows)
    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get(TAG_ROLE) == "sweep"]
    children = [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]
    assert len(parents) == 1
    parent_id = parents[0].info.run_id
    assert SweepRecord.read(sweep_dir).parent_run_id == parent_id
    assert parents[0].info.status == "FINISHED"
    assert len(children) == 4
    assert sorted(r.data.tags["trial_id"] for r in children) == sorted(r.trial_id for r in rows)
    combos = set()
    for child in children:
        tags = child.data.tags
        assert tags[TAG_PARENT] == parent_id
        assert {"family", "precision", "seed", "pair_id", "trial_id", "fell_back_to_f32"} <= set(
            tags
        )
        combos.add((tags["family"], tags["precision"]))
        assert child.info.status == "FINISHED"
        assert child.data.params["family"] == tags["family"] and "lr" in child.data.params
        history = client.get_metric_history(child.info.run_id, "val_sharpe")
        assert sorted(m.step for m in history) == [1, 2]
        for key in ("train_loss", "skipped_steps", "steps_per_s", "peak_mem_mb", "test_sharpe"):
            assert len(client.get_metric_history(child.info.run_id, key)) == 2, key
    assert combos == {("tft", "f32"), ("tft", "bf16"), ("dqn", "f32"), ("dqn", "bf16")}
    assert "best_val_sharpe.tft.bf16" in parents[0].data.metrics


def test_trial_folders_hold_tunes_result_files_but_no_tensorboard_events(finished_sweep) -> None:  # type: ignore[no-untyped-def]
    """MLflow records every trial; TensorBoard event files (whose writer fsyncs on every
    flush, in Tune's event loop) are not written."""
    _, rows, sweep_dir = finished_sweep
    folders = [p for p in sweep_dir.iterdir() if p.is_dir()]
    assert len(folders) == len(rows)
    for folder in folders:
        names = {p.name for p in folder.iterdir()}
        assert {"result.json", "progress.csv", "params.json"} <= names, names
        assert not [n for n in names if n.startswith("events.out.tfevents")], names


def test_newest_checkpoint_is_safetensors_in_the_trial_dtype(finished_sweep) -> None:  # type: ignore[no-untyped-def]
    _, _, sweep_dir = finished_sweep
    for row in trial_rows(sweep_dir):
        assert row.checkpoint is not None and row.checkpoint.endswith("checkpoint_000001/state")
        with safe_open(str(Path(row.checkpoint) / "model.safetensors"), "pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
        # Only keep_f32 tensors (TFT quantile levels, DQN nothing) may differ from the policy.
        assert EXPECTED_DTYPE[row.precision] in dtypes
        if row.precision == "bf16":
            assert dtypes <= {"BF16", "F32"}
        else:
            assert dtypes == {"F32"}


def test_status_and_best_then_continue_the_best_bf16_trial_in_f32(finished_sweep, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, rows, sweep_dir = finished_sweep
    runner = CliRunner()
    status = runner.invoke(app, ["status", str(sweep_dir), "--json"])
    assert status.exit_code == 0, status.output
    assert '"planned": 4' in status.output
    # Every trial reported its CPU time through Tune; logical GPUs on a CPU hold no GPU.
    spent = json.loads(status.output)["spent"]
    assert spent["all"]["cpu_hours"] > 0 and spent["all"]["gpu_hours"] == 0
    assert set(spent) == {"all", *(r.precision for r in rows)}
    best = runner.invoke(
        app, ["best", str(sweep_dir), "--family", "tft", "--precision", "bf16", "--json"]
    )
    assert best.exit_code == 0, best.output
    bf16 = next(r for r in rows if r.family == "tft" and r.precision == "bf16")
    assert bf16.checkpoint is not None and bf16.checkpoint in best.output.replace("\n", "")
    out = tmp_path / "longer"
    result = runner.invoke(
        app,
        [
            "train",
            "--resume",
            bf16.checkpoint,
            "--out",
            str(out),
            "--precision",
            "f32",
            "--epochs",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "resuming at epoch 2" in result.output
    assert (out / "checkpoints" / "epoch_0003" / "meta.json").exists()


def test_a_sweep_whose_trials_all_fail_alike_stops_with_the_error(ray_session, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The bars vanish after the spec checked them: every trial would fail the same way,
    so the sweep stops after its first three failures and says why, instead of running
    all four trials with their FailureConfig retries (three attempts each)."""
    csv = tmp_path / "bars.csv"
    synthetic_bars(n_assets=2, n_bars=600, seed=1).to_frame().to_csv(csv, index=False)
    spec = tiny_spec(tmp_path, name="vanished", data={"source": str(csv)}, max_failures=2)
    csv.unlink()
    with pytest.raises(SweepError) as stopped:
        run_sweep(spec)
    message = str(stopped.value)
    assert "its first 3 failures, in 2 trials, were the same error" in message, message
    assert f"data source {str(csv)!r} does not exist" in message, message
    sweep_dir = Path(spec.storage) / spec.name
    attempts = sum(p.read_text().count("Failure #") for p in sweep_dir.glob("*/error.txt"))
    assert 3 <= attempts < spec.n_trials * (spec.max_failures + 1), attempts
    # Trials still waiting were stopped before they ran (Tune marks those TERMINATED).
    assert all(r.epochs == 0 for r in trial_rows(sweep_dir))


def _run_trial_with_a_planted_oom(folder: str):  # type: ignore[no-untyped-def]
    """The real ``run_trial``, whose first bf16 attempt runs out of CUDA memory in its
    second epoch's training step (after epoch 1 was reported and logged)."""

    def run_trial_with_a_planted_oom(config, share, judge=None, exchange=None):  # type: ignore[no-untyped-def]
        import torch

        from trainables import trial as trial_module
        from trainables.trainer import Trainer

        marker = Path(folder) / "oom-planted"
        if config["precision"] != "bf16" or marker.exists():
            trial_module.run_trial(config, share, judge, exchange)
            return
        marker.write_text(f"{config['precision']}/{config['seed']}")
        original = Trainer.train_epoch
        epochs = [0]

        def step(self):  # type: ignore[no-untyped-def]
            epochs[0] += 1
            if epochs[0] == 2:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted in a step)")
            return original(self)

        Trainer.train_epoch = step  # type: ignore[method-assign]
        try:
            trial_module.run_trial(config, share, judge, exchange)
        finally:  # the actor may be reused by the next trial
            Trainer.train_epoch = original  # type: ignore[method-assign]

    return run_trial_with_a_planted_oom


def test_an_oom_retry_continues_its_run_resolves_its_pair_and_the_sweep_finishes(
    ray_session, tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A compare sweep of one pair with measured shares on the session's 4 logical GPUs
    (the ClusterPacker): the bf16 trial runs out of memory in epoch 2 and is retried with
    a larger share; MLflow then holds one run per trial, the retry's, the pair is
    compared, and the parent run is FINISHED."""
    from hpo.compare import comparison_from_mlflow
    from trainables import tune_entry

    folder = tmp_path / "events"
    folder.mkdir()
    # The trainable the sweep hands Tune (the worker then runs the real trial loop).
    monkeypatch.setattr(tune_entry, "run_trial", _run_trial_with_a_planted_oom(str(folder)))
    spec = tiny_spec(
        tmp_path,
        name="oom-retry",
        families=["tft"],
        search_space={"tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1}},
        compare=True,
        resources={"cpu": 1, "gpu": "measured"},
    )
    events: list[str] = []
    rows = run_sweep(spec, on_event=events.append)
    assert events[0].startswith("GPU packing plan:")  # printed before launch
    assert len(rows) == spec.n_trials == 2 and all(r.done for r in rows)
    attempts = trial_rows(Path(spec.storage) / spec.name, retried=True)
    (oomed,) = [r for r in attempts if r.oom_retry_gpu_fraction is not None]
    retry = next(r for r in rows if r.precision == "bf16")
    assert len(attempts) == 3
    assert (oomed.precision, oomed.seed) == (retry.precision, retry.seed) == ("bf16", 0)
    assert oomed.epochs == 2 and retry.epochs == 2
    assert retry.gpu_fraction_floor == oomed.oom_retry_gpu_fraction > 0
    assert any("out of GPU memory: retrying" in e for e in events)

    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(spec.name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get(TAG_ROLE) == "sweep"]
    children = [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]
    assert parent.info.status == "FINISHED"
    assert len(children) == 2  # one run per trial: the retry continued the bf16 run
    bf16 = next(r for r in children if r.data.tags["precision"] == "bf16")
    tags = bf16.data.tags
    assert bf16.info.status == "FINISHED" and tags["trial_status"] == "completed"
    assert tags["trial_id"] == retry.trial_id and tags["hpo.oom_attempts"] == oomed.trial_id
    assert "failure_reason" not in tags and bf16.data.metrics["oom"] == 0
    # the run's latest val_sharpe is the retry's last epoch, after the OOM's NaN
    assert bf16.data.metrics["val_sharpe"] == pytest.approx(retry.val_sharpe)
    history = client.get_metric_history(bf16.info.run_id, "val_sharpe")
    assert sorted(m.step for m in history) == [
        1,
        1,
        2,
    ]  # attempt 1: epoch 1 (OOM in 2); retry: 1, 2
    plan_text = client.download_artifacts(parent.info.run_id, "packing_plan.txt", str(tmp_path))
    assert Path(plan_text).read_text() == events[0]

    comparison = comparison_from_mlflow(
        spec.name, spec.tracking_uri, parent_run_id=parent.info.run_id, with_returns=False
    )
    (contrast,) = comparison.families["tft"].contrasts.values()
    assert contrast.pair_ids == [retry.pair_id] and contrast.incomplete == {}
