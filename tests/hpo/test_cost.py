"""What a precision costs: the trainer's running totals survive a resume, a trial's GPU
time is its share times its seconds on CUDA only, and the comparison pairs the totals by
configuration into a ratio with its interval, in the headline, the table, the parent run
and ``hpo status``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.tracking import MlflowClient
from rich.console import Console
from typer.testing import CliRunner

from dashboards.tables import cost_headline, rich_tables
from hpo.cli import app
from hpo.cli._sweeps import _spent_line
from hpo.compare import TrialRecord, compare_trials
from hpo.cost import summarise_cost
from hpo.trials import TrialRow, TrialStatus, spent_hours
from tests.hpo.compare_helpers import SyntheticSweep, paired_records, trial_record
from tests.trainables.helpers import tiny_config
from trainables.checkpoint import load_checkpoint
from trainables.trainer import Trainer
from trainables.trial import gpu_cost


def _costed(
    precision: str, group: int, seed: int, gpu_s: float, *, share: float, state: str = "completed"
) -> TrialRecord:
    record = trial_record("tft", precision, group, seed, 0.5, state=state)
    return dataclasses.replace(
        record,
        time_s=gpu_s / share,
        cpu_s=2 * gpu_s,
        gpu_s=gpu_s,
        gpu_fraction=share,
        steps_per_s=100.0 if precision == "f32" else 170.0,
        peak_mem_mb=200.0 if precision == "f32" else 110.0,
    )


def test_the_ratio_is_paired_by_configuration_with_seeds_averaged() -> None:
    trials = [
        # configuration 0: f32 seeds 100 s and 120 s (mean 110), bf16 50 and 60 (mean 55)
        _costed("f32", 0, 0, 100.0, share=0.25),
        _costed("f32", 0, 1, 120.0, share=0.25),
        _costed("bf16", 0, 0, 50.0, share=0.125),
        _costed("bf16", 0, 1, 60.0, share=0.125),
        # configuration 1: 200 s against 80 s
        _costed("f32", 1, 0, 200.0, share=0.25),
        _costed("bf16", 1, 0, 80.0, share=0.125),
        # a diverged bf16 trial: its time was spent, but it is no configuration's cost
        _costed("bf16", 2, 0, 1000.0, share=0.125, state="diverged"),
        _costed("f32", 2, 0, 10.0, share=0.25),
    ]
    cost = summarise_cost(trials, ["f32", "bf16"])
    assert cost.basis == "gpu" and cost.notes == []
    assert cost.by_precision["bf16"].gpu_hours == pytest.approx((50 + 60 + 80 + 1000) / 3600)
    assert cost.by_precision["f32"].gpu_hours == pytest.approx((100 + 120 + 200 + 10) / 3600)
    assert cost.by_precision["f32"].gpu_fraction == 0.25
    ratio = cost.ratios["bf16"]
    assert ratio.configs == 2  # configuration 2 has no completed bf16 trial
    logs = [math.log(55 / 110), math.log(80 / 200)]  # ratios 0.5 and 0.4
    assert ratio.hours_ratio == pytest.approx(math.sqrt(0.5 * 0.4))
    # t-interval on the two log ratios: sd |l0 - l1| / sqrt 2, t(0.975, 1) = 12.706
    half = 12.7062047 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    mean = sum(logs) / 2
    assert ratio.ci_low == pytest.approx(math.exp(mean - half), rel=1e-6)
    assert ratio.ci_high == pytest.approx(math.exp(mean + half), rel=1e-6)
    assert ratio.trials_per_gpu == pytest.approx(2.0)
    assert ratio.step_speedup == pytest.approx(1.7)
    assert ratio.memory_ratio == pytest.approx(0.55)
    assert ratio.sentence() == (
        "bf16 used 0.45x the GPU-hours of f32 per configuration (95% CI 0.11-1.85, "
        "2 configurations), 2.0x trials per GPU, steps 1.70x as fast, peak memory 0.55x"
    )


def test_a_cpu_sweep_compares_cpu_hours_and_says_gpu_figures_need_a_gpu_run() -> None:
    trials = [
        dataclasses.replace(t, gpu_s=0.0, gpu_fraction=0.0)
        for t in (_costed("f32", 0, 0, 10.0, share=0.5), _costed("bf16", 0, 0, 40.0, share=0.5))
    ]
    cost = summarise_cost(trials, ["f32", "bf16"])
    assert cost.basis == "cpu"
    assert cost.ratios["bf16"].hours_ratio == pytest.approx(4.0)  # cpu_s = 2 x 40 / 2 x 10
    assert math.isnan(cost.ratios["bf16"].trials_per_gpu)
    assert cost.by_precision["bf16"].gpu_hours == 0.0
    assert any("GPU-hours need a GPU run" in note for note in cost.notes)
    assert "4.00x the CPU-hours of f32" in cost.ratios["bf16"].sentence()


def test_trials_without_a_recorded_cost_say_so_instead_of_a_ratio() -> None:
    records = paired_records("tft", [[0.5]] * 3, [[0.6]] * 3)  # no time_s: NaN
    comparison = compare_trials(records, ("f32", "bf16"), margin=0.1)
    cost = comparison.overall.cost
    assert cost.ratios["bf16"].configs == 0 and math.isnan(cost.ratios["bf16"].hours_ratio)
    assert cost_headline(comparison) == [
        "Cost: bf16 vs f32 cost: no configuration completed in both with its cost recorded",
        "Cost: no trial recorded its cost (time_s_total, logged at the end of each epoch)",
    ]


def test_trainer_totals_run_on_across_a_resume(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(epochs=3))
    first = trainer.train_epoch()
    second = trainer.train_epoch()
    assert first["time_s_total"] == first["epoch_time_s"] > 0
    assert second["time_s_total"] == pytest.approx(first["epoch_time_s"] + second["epoch_time_s"])
    assert second["cpu_s_total"] == pytest.approx(first["epoch_cpu_s"] + second["epoch_cpu_s"])
    trainer.save(tmp_path / "ckpt")
    resumed = Trainer(tiny_config(epochs=3), checkpoint=load_checkpoint(tmp_path / "ckpt"))
    third = resumed.train_epoch()
    assert third["time_s_total"] == pytest.approx(second["time_s_total"] + third["epoch_time_s"])
    assert third["cpu_s_total"] == pytest.approx(second["cpu_s_total"] + third["epoch_cpu_s"])


def test_gpu_time_is_each_epochs_share_times_its_seconds_on_cuda_only() -> None:
    # Only the device fact is faked. Epoch 1 ran at a 0.25 share (its 10 GPU-s are in the
    # checkpointed history); after a resume at 0.5 the 20 s epoch 2 adds 10 more: 20, not
    # the 0.5 x 60 = 30 that pricing every epoch at the current share would give.
    history = [{"epoch_time_s": 40.0, "epoch_gpu_s": 10.0}, {"epoch_time_s": 20.0}]
    on_cuda = SimpleNamespace(device=torch.device("cuda", 0), history=history)
    assert gpu_cost(on_cuda, 0.5) == {"gpu_fraction": 0.5, "gpu_s_total": 20.0}  # type: ignore[arg-type]
    assert history[-1]["epoch_gpu_s"] == 10.0  # kept for the next resume
    on_cpu = SimpleNamespace(device=torch.device("cpu"), history=[{"epoch_time_s": 40.0}])
    assert gpu_cost(on_cpu, 0.25) == {"gpu_fraction": 0.0, "gpu_s_total": 0.0}  # type: ignore[arg-type]


def test_the_parent_run_and_the_cli_carry_the_cost(sweep: SyntheticSweep) -> None:
    """The synthetic sweep's trials report bf16 at 0.6x the seconds on half the share."""
    from hpo.compare import comparison_from_mlflow, comparison_metrics, comparison_tags

    comparison = comparison_from_mlflow(
        sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"), with_curves=False
    )
    metrics, tags = comparison_metrics(comparison), comparison_tags(comparison)
    assert metrics["cmp.tft.bf16_vs_f32.cost.gpu_hours_ratio"] == pytest.approx(0.3)
    assert metrics["cmp.overall.bf16_vs_f32.cost.trials_per_gpu_ratio"] == pytest.approx(2.0)
    assert metrics["cmp.tft.f32.gpu_hours"] > metrics["cmp.tft.bf16.gpu_hours"] > 0
    assert tags["cmp.overall.bf16_vs_f32.cost"].startswith(
        "bf16 used 0.30x the GPU-hours of f32 per configuration"
    )
    result = CliRunner().invoke(
        app,
        [
            *("compare", "--experiment", sweep.experiment, "--tracking-uri", sweep.tracking_uri),
            *("--precision", "f32", "--precision", "bf16"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Cost: bf16 used 0.30x the GPU-hours of f32" in result.output
    assert "0.30x GPU-h" in result.output  # the table's cost column
    # The MLflow UI: how to serve the local store, then the trials in the runs table.
    assert "MLflow UI: mlflow ui --backend-store-uri" in result.output
    experiment_id = MlflowClient(sweep.tracking_uri).get_experiment_by_name(sweep.experiment)
    assert experiment_id is not None
    link = f"http://127.0.0.1:5000/#/experiments/{experiment_id.experiment_id}/runs?"
    assert f"{link}workflowType=machine_learning&searchFilter=" in result.output


def test_the_default_table_fits_100_columns_and_wide_keeps_every_statistic(
    sweep: SyntheticSweep,
) -> None:
    from hpo.compare import comparison_from_mlflow

    comparison = comparison_from_mlflow(
        sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"), with_curves=False
    )

    def printed(wide: bool) -> str:
        console = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        for item in rich_tables(comparison, wide=wide):
            console.print(item)
        return console.export_text()

    compact = printed(wide=False)
    assert max(len(line) for line in compact.splitlines()) <= 100
    assert "…" not in compact  # nothing squeezed to an ellipsis
    lines = [line.strip() for line in compact.splitlines()]
    rows = [line for line in lines if line.startswith(("tft ", "dqn ", "overall "))]
    assert len(rows) == 3 and all("bf16 - f32" in row and "GPU-h" in row for row in rows)
    assert "Wilcoxon p" not in compact and "DSR best" not in compact  # --wide columns
    wide = printed(wide=True)
    assert "Wilcoxon p" in wide and "DSR best" in wide and "tft: 12 trials" in wide


def _row(precision: str, gpu_s: float, cpu_s: float) -> TrialRow:
    return TrialRow(
        trial_id=f"t-{precision}-{gpu_s}",
        family="tft",
        precision=precision,
        seed=0,
        pair_id="p",
        status=TrialStatus("TERMINATED"),
        epochs=3,
        val_sharpe=0.1,
        test_sharpe=0.1,
        fell_back_to_f32=False,
        diverged=False,
        params={},
        checkpoint=None,
        gpu_s=gpu_s,
        cpu_s=cpu_s,
    )


def test_status_sums_the_hours_spent_per_precision_and_says_when_no_gpu_ran() -> None:
    rows = [_row("f32", 3600.0, 1800.0), _row("f32", 1800.0, 0.0), _row("bf16", 720.0, 360.0)]
    spent = spent_hours(rows)
    assert spent["all"] == {"gpu_hours": pytest.approx(1.7), "cpu_hours": pytest.approx(0.6)}
    assert spent["f32"]["gpu_hours"] == pytest.approx(1.5)
    assert _spent_line(spent) == (
        "spent so far: 1.70 GPU-hours, 0.60 CPU-hours (GPU / CPU: f32 1.50 / 0.50, "
        "bf16 0.20 / 0.10)"
    )
    cpu_only = spent_hours([_row("f32", 0.0, 36.0)])
    assert _spent_line(cpu_only).endswith("; no trial has run on a GPU")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SyntheticSweep:
    from tests.hpo.compare_helpers import build_sweep

    return build_sweep(tmp_path_factory.mktemp("cost"))


def test_cost_totals_are_in_mlflow_as_the_trial_reported_them(sweep: SyntheticSweep) -> None:
    client = MlflowClient(sweep.tracking_uri)
    run_id = next(iter(sweep.run_ids.values()))
    metrics = client.get_run(run_id).data.metrics
    assert {"time_s_total", "cpu_s_total", "gpu_s_total", "gpu_fraction"} <= set(metrics)
