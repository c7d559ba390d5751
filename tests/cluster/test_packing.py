"""GPU fractions: the rounding grid by hand, trial configs through the table, the per-trial
memory cap, the retry after an OOM, and the benchmark's smoke mode."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cluster import packing
from cluster.packing import (
    TrialDoesNotFit,
    apply_memory_cap,
    gpu_fraction,
    gpu_fraction_for_trial,
    plan,
    retry_fraction_after_oom,
    trial_memory_metrics,
    trials_per_gpu,
)
from cluster.vram_table import VramTable, profile_key
from tests.bench_scripts import load_bench_script
from tests.cluster.test_vram_table import fake_profile
from trainables.config import TrainConfig, TrialConfig

GiB = 2**30
MiB = 2**20
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("peak", "context", "total", "headroom", "steps", "expected"),
    [
        # (10 * 1.15 + 0.5) / 80 = 0.15 exactly: not a step more (0.15 * 20 > 3 in floats)
        (10 * GiB, GiB // 2, 80 * GiB, 0.15, 20, 0.15),
        (10 * GiB, GiB // 2, 80 * GiB, 0.15, 10_000, 0.15),
        # a MiB more is one of Ray's 1e-4 steps more, not a 0.05 grid step (the old 0.20)
        (10 * GiB + MiB, GiB // 2, 80 * GiB, 0.15, 10_000, 0.1501),
        # (3 * 1.5 + 0.5) / 40 = 0.125: exact at Ray's resolution (the grid made it 0.15)
        (3 * GiB, GiB // 2, 40 * GiB, 0.5, 10_000, 0.125),
        # (3 * 1.0 + 0.1) / 41 = 0.0756097...: up to 0.0757
        (3 * GiB, GiB // 10, 41 * GiB, 0.0, 10_000, 0.0757),
        # seed-scale DQN f32 on an H200: 0.0714023 rounds DOWN to 0.0714 (14 per GPU, not
        # 13), giving up 2e-6 of the GPU, far less than half its headroom
        (8_287_693_952, 512 * MiB, 141 * 10**9, 0.15, 10_000, 0.0714),
        # ... but not without headroom to give: up to 0.0715
        (int(8_287_693_952 * 1.15), 512 * MiB, 141 * 10**9, 0.0, 10_000, 0.0715),
        # a tiny trial still takes one step; a huge one is capped at the whole GPU
        (1 * MiB, 0, 80 * GiB, 0.15, 10_000, 0.0001),
        (200 * GiB, GiB // 2, 80 * GiB, 0.15, 10_000, 1.0),
    ],
)
def test_fraction_rounds_at_rays_resolution(
    peak: int, context: int, total: int, headroom: float, steps: int, expected: float
) -> None:
    assert gpu_fraction(peak, context, total, headroom, steps) == expected


def test_trials_per_gpu() -> None:
    assert [trials_per_gpu(f) for f in (0.05, 0.1, 0.15, 0.25, 0.3, 0.5, 1.0)] == [
        20,
        10,
        6,
        4,
        3,
        2,
        1,
    ]


def test_plan_uses_the_gpu_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = fake_profile(peak_mib=10 * 1024)  # 10 GiB peak, 0.5 GiB context
    monkeypatch.delenv("HPO_GPU_TOTAL_GB", raising=False)
    at_80 = plan(profile, headroom=0.15)
    assert (at_80.device_total_bytes, at_80.fraction, at_80.trials_per_gpu) == (80 * GiB, 0.15, 6)
    assert at_80.trials_per_gpu_unrounded == 6 and at_80.grid == 10_000  # 80 / 12
    monkeypatch.setenv("HPO_GPU_TOTAL_GB", "40")
    at_40 = plan(profile, headroom=0.15)
    assert (at_40.device_total_bytes, at_40.fraction, at_40.trials_per_gpu) == (40 * GiB, 0.3, 3)
    measured = fake_profile(
        peak_mib=10 * 1024,
        method="measured",
        device_total_bytes=120 * GiB,
        measured_allocated_bytes=9 * GiB,
        measured_reserved_bytes=11 * GiB,
    )
    # A measured profile packs its reserved peak against its own GPU: (11*1.15+0.5)/120.
    assert plan(measured, headroom=0.15).fraction == 0.1096


def trial_config(**extra: Any) -> dict[str, Any]:
    """A sweep trial config as SweepSearcher builds it (tiny shapes)."""
    return {
        "family": "tft",
        "precision": "bf16",
        "seed": 0,
        "params": {"d_model": 8, "n_heads": 1, "lr": 1e-3},
        "base": {
            "epochs": 1,
            "trainer": {"n_folds": 1, "lookback": 16, "batch_size": 32},
            "data": {"n_assets": 2, "n_bars": 600},
        },
        **extra,
    }


def train_config(**extra: Any) -> TrainConfig:
    return TrialConfig.from_dict(trial_config(**extra)).train_config()


def _seeded_table(tmp_path: Path, peak_mib: int) -> tuple[VramTable, dict[str, Any]]:
    table = VramTable(tmp_path / "vram.json")
    key = profile_key(train_config(), torch.device("cpu"), "estimate")
    table.put(key, fake_profile(peak_mib=peak_mib))
    return table, key


def test_trial_fraction_from_the_table_with_oom_boost_and_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_GPU_TOTAL_GB", "80")
    table, key = _seeded_table(tmp_path, peak_mib=10 * 1024)

    def fraction(floor: float = 0.0, **extra: Any) -> float:
        return gpu_fraction_for_trial(
            train_config(**extra), headroom=0.15, floor=floor, table=table, mode="estimate"
        )

    assert fraction() == 0.15  # (10 * 1.15 + 0.5) / 80
    assert fraction(seed=7, params={"d_model": 8, "n_heads": 1, "lr": 3e-4}) == 0.15
    assert table.measurements == 0  # found in the table: nothing profiled
    table.record_oom(key)  # headroom doubles: (10 * 1.3 + 0.5) / 80 = 0.16875 -> 0.1688
    assert fraction() == 0.1688
    assert fraction(floor=0.35) == 0.35
    metrics = trial_memory_metrics(train_config(), 0.2, table=table, mode="estimate")
    assert metrics["vram_gpu_fraction"] == 0.2
    assert metrics["vram_predicted_peak_mb"] == 10 * 1024
    assert metrics["vram_predicted_total_mb"] == 10 * 1024 + 512


def test_retry_after_oom_grows_the_fraction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_GPU_TOTAL_GB", "80")
    table = VramTable(tmp_path / "vram.json")
    config = train_config()
    first = gpu_fraction_for_trial(config, table=table, mode="estimate")
    key = profile_key(config, torch.device("cpu"), "estimate")
    profile = table.get(key)
    assert profile is not None and table.measurements == 1
    # a tiny TFT: little more than its 1 GiB context, exactly (no grid step of 0.05)
    assert first == plan(profile, 0.15).fraction < 0.02
    retry = retry_fraction_after_oom(config, first, table=table, mode="estimate")
    # at least 15% more; here the doubled headroom on the re-measured peak
    assert retry >= first * 1.15 - 1e-4 and retry == max(
        plan(profile, 0.3).fraction, math.ceil(first * 1.15 * 10_000) / 10_000
    )
    assert table.oom_count(key) == 1
    with pytest.raises(TrialDoesNotFit, match="whole GPU"):
        retry_fraction_after_oom(config, 1.0, table=table, mode="estimate")


def test_a_group_oom_is_recorded_against_its_group_shape_and_split_on_a_whole_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OOM of a group trial of 3 counts against the 3-trial shape (the one its share
    was profiled for), not against a trial alone; on a whole GPU PackedShare splits it,
    each half at no less than half the GPU."""
    from cluster.trial_share import PackedShare

    monkeypatch.setenv("HPO_GPU_TOTAL_GB", "80")
    monkeypatch.setenv("HPO_VRAM_CACHE", str(tmp_path / "vram.json"))
    monkeypatch.setenv("HPO_VRAM_MODE", "estimate")
    table = VramTable(tmp_path / "vram.json")
    config = train_config()
    cpu = torch.device("cpu")
    first = gpu_fraction_for_trial(config, table=table, mode="estimate", group_size=3)
    alone = gpu_fraction_for_trial(config, table=table, mode="estimate")
    # one context for three: a group of tiny trials costs little more than one
    assert (
        plan(table.get(profile_key(config, cpu, "estimate", 3)), 0.15).raw_fraction
        > plan(table.get(profile_key(config, cpu, "estimate")), 0.15).raw_fraction
    )
    assert alone <= first < 3 * alone
    retry = retry_fraction_after_oom(config, first, table=table, mode="estimate", group_size=3)
    assert retry >= first * 1.15 - 1e-4
    group_key, alone_key = (profile_key(config, cpu, "estimate", n) for n in (3, 1))
    assert (table.oom_count(group_key), table.oom_count(alone_key)) == (1, 0)
    with pytest.raises(TrialDoesNotFit, match="a group of 3 tft/bf16 ran out of memory"):
        retry_fraction_after_oom(config, 1.0, table=table, mode="estimate", group_size=3)

    import ray

    ray_before = ray.is_initialized()
    share = PackedShare()  # outside Tune and Ray: the process's table (HPO_VRAM_CACHE)
    split = share.after_oom(config, 1.0, "CUDA out of memory", group_size=3)
    # Asking for this node's GPU type outside Ray starts no Ray (one without the test
    # session's logical GPUs would then be every later test's).
    assert ray.is_initialized() == ray_before
    assert (split["oom_split"], split["oom_retry_gpu_fraction"]) == (1, 0.5)
    assert "as a group of 3: split in two" in split["failure_reason"]
    grown = share.after_oom(config, first, "CUDA out of memory", group_size=3)
    assert "oom_split" not in grown and grown["oom_retry_gpu_fraction"] > first
    assert VramTable(tmp_path / "vram.json").oom_count(group_key) == 2
    alone_whole = share.after_oom(config, 1.0, "CUDA out of memory")
    assert "oom_split" not in alone_whole and "whole GPU" in alone_whole["failure_reason"]


def test_memory_cap_leaves_the_context_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packing, "_applied_cap", None)  # restored after the test
    monkeypatch.setattr(packing.torch, "cuda", SimpleNamespace(is_available=lambda: False))
    assert apply_memory_cap(0.25) is None  # no CUDA: nothing to cap
    calls: list[tuple[float, int]] = []
    fake_cuda = SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: 0,
        get_device_properties=lambda _: SimpleNamespace(total_memory=80 * GiB),
        set_per_process_memory_fraction=lambda f, d: calls.append((f, d)),
    )
    monkeypatch.setattr(packing.torch, "cuda", fake_cuda)
    assert apply_memory_cap(0.25, context_bytes=GiB // 2) == pytest.approx(0.25 - 0.5 / 80)
    assert calls == [(pytest.approx(0.24375), 0)]
    assert apply_memory_cap(0.0) is None and apply_memory_cap(1.0) is None
    assert apply_memory_cap(None) is None and len(calls) == 1
    # a share smaller than the context keeps half of itself for the allocator
    assert apply_memory_cap(0.004, context_bytes=GiB // 2) == pytest.approx(0.002)


def load_bench() -> Any:
    return load_bench_script("gpu_packing.py", "gpu_packing")


def test_benchmark_smoke_writes_json_and_markdown(tmp_path: Path) -> None:
    bench = load_bench()
    report = bench.main(["--smoke", "--seconds", "0.05", "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "gpu_packing.json").read_text())
    assert stored["rows"] == report["rows"] and not stored["measured"]
    assert [(r["family"], r["precision"]) for r in stored["rows"]] == [
        ("dqn", "f32"),
        ("dqn", "bf16"),
        ("tft", "f32"),
        ("tft", "bf16"),
    ]
    for row in stored["rows"]:
        assert row["estimate_mib"] > 64  # at least two cuBLAS workspaces
        assert row["context_measured"] is False and row["context_mib"] == 1024  # the allowance
        # exact shares of an 80 GiB GPU: ~0.015 (the 1/20 grid gave 0.05, 20 per GPU)
        assert 0.0125 < row["fraction"] < 0.02 and row["trials_per_gpu"] > 50
        assert row["trials_per_gpu"] >= 0.95 * row["trials_per_gpu_by_memory"]
        assert row["steps_per_s"] > 0
        # no CUDA: nothing replayed from a graph, the eager step is the one timed
        assert row["cuda_graphs"] is False and row["ms_per_step_eager"] == row["ms_per_step"]
        assert row["ms_per_step"] == pytest.approx(1000 / row["steps_per_s"], rel=0.01)
    assert set(stored["ratios"]) == {"dqn", "tft"}
    assert stored["ratios"]["dqn"]["peak"] < 1.0
    text = (tmp_path / "gpu_packing.md").read_text()
    assert "NOT MEASURED ON A GPU" in text and "| dqn | bf16 |" in text
    assert (
        stored["sweep"] is None
    )  # the packed sweep needs Ray: tests/cluster/test_profile_on_worker.py


def test_benchmark_keeps_each_row_when_a_later_one_fails_or_the_budget_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU run is one command with a time limit: every row is on disk as soon as it is
    measured, a failing row is named and skipped, and rows that would not fit the budget
    are listed as skipped instead of being started."""
    bench = load_bench()
    measure = bench.bench_one
    on_disk: list[int] = []

    def bench_one(family: str, precision: str, *args: Any) -> dict[str, Any]:
        if (family, precision) == ("dqn", "bf16"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if family == "tft":  # the first row was written before this one started
            on_disk.append(len(json.loads((tmp_path / "gpu_packing.json").read_text())["rows"]))
        return measure(family, precision, *args)

    monkeypatch.setattr(bench, "bench_one", bench_one)
    report = bench.main(["--smoke", "--seconds", "0.05", "--out", str(tmp_path)])
    assert [(r["family"], r["precision"]) for r in report["rows"]] == [
        ("dqn", "f32"),
        ("tft", "f32"),
        ("tft", "bf16"),
    ]
    assert on_disk == [1, 2]
    assert report["skipped"] == ["dqn/bf16 (RuntimeError: CUDA error: an illegal memory access "
                                 "was encountered)"]  # fmt: skip


class _Clock:
    """perf_counter for the bench: each measured row takes ``row_s`` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_starts_a_row_only_if_it_and_the_sweeps_reserve_still_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of 100 s each against a 420-s budget: with the sweep's 150-s reserve two rows
    fit (0 + 100 + 150, then 100 + 100 + 150 <= 420; the third would end at 450), then the
    sweep starts (200 + 150 <= 420) with the budget's end as its deadline. Without the
    sweep four rows fit. Nothing that was skipped is lost from the report."""
    bench = load_bench()
    clock = _Clock()
    monkeypatch.setattr(bench.time, "perf_counter", clock)

    def bench_one(family: str, precision: str, *args: Any) -> dict[str, Any]:
        clock.now += 100.0
        return {"family": family, "precision": precision}

    sweeps: list[tuple[tuple[str, ...], float | None]] = []

    def packed_sweep(families: tuple[str, ...], *args: Any, deadline: float | None) -> Any:
        sweeps.append((families, deadline))
        return {"trials": 2, "ooms": 0, "errors": 0, "most_at_once": 2, "plan": "", "elapsed_s": 1}

    monkeypatch.setattr(bench, "bench_one", bench_one)
    monkeypatch.setattr(bench, "markdown", lambda report: "")
    monkeypatch.setattr(bench, "bf16_ratios", lambda rows, families: {})
    monkeypatch.setattr(bench, "packed_sweep", packed_sweep)
    report = bench.main(["--smoke", "--sweep", "--out", str(tmp_path)])
    assert [(r["family"], r["precision"]) for r in report["rows"]] == [
        ("dqn", "f32"),
        ("dqn", "bf16"),
    ]
    assert report["skipped"] == ["tft/f32 (time budget: 200 s used)",
                                 "tft/bf16 (time budget: 200 s used)"]  # fmt: skip
    assert sweeps == [(("dqn",), 420.0)]  # tft was left out; the deadline is the budget's end

    clock.now = 0.0
    alone = bench.main(["--smoke", "--no-sweep", "--out", str(tmp_path / "alone")])
    assert len(alone["rows"]) == 4 and alone["skipped"] == []

    clock.now = 0.0
    late = bench.main(["--smoke", "--sweep", "--out", str(tmp_path / "late"), "--budget-s", "0"])
    assert late["rows"] == [] and len(late["skipped"]) == 4 and len(sweeps) == 1
    assert late["sweep_skipped"] == "no family has both rows measured"
    assert json.loads((tmp_path / "late" / "gpu_packing.json").read_text())["skipped"]


class _Results:
    """Ray Tune's ResultGrid as the bench reads it: per trial its metric history, its last
    result and its error."""

    def __init__(self, histories: list[list[dict[str, Any]]], errors: list[Any]) -> None:
        import pandas as pd

        self.items = [
            SimpleNamespace(
                metrics_dataframe=pd.DataFrame(history), metrics=history[-1], error=error
            )
            for history, error in zip(histories, errors, strict=True)
        ]
        self.num_errors = sum(e is not None for e in errors)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def test_the_bench_sweep_counts_an_oom_reported_before_the_trials_last_result() -> None:
    """run_trial reports the OOM and returns; the bench's trial then reports its span, so
    the OOM is in the history, not in the last result (which the old count read: 0)."""
    bench = load_bench()
    oom = {"epoch": 1, "oom": 1, "failure_reason": "CUDA out of memory at GPU share 0.05"}
    results = _Results(
        [
            [oom, {"start": 0.0, "end": 5.0, "done": 1}],
            [{"epoch": 1, "val_sharpe": 0.1}, {"start": 1.0, "end": 4.0, "done": 1}],
            [{"start": 6.0, "end": 7.0, "done": 1}],
        ],
        [None, None, RuntimeError("worker died")],
    )
    results.items[2].metrics_dataframe = None  # a trial that died before its first result
    outcome = bench.sweep_outcome(results)
    assert (outcome["ooms"], outcome["errors"], outcome["most_at_once"]) == (1, 1, 2)
    assert outcome["failures"] == [
        "CUDA out of memory at GPU share 0.05",
        "RuntimeError: worker died",
    ]


def test_the_bench_sweep_counts_trials_admitted_together_whose_runs_did_not_overlap(
    tmp_path: Path,
) -> None:
    """A smoke trial trains in about the time a loaded machine takes to start the next
    trial's worker: a CI run counted 1 at once where Ray ran 2. Each trial now waits, once
    trained, for the others, so trials admitted together overlap; one that no other joins
    waits its hold and ends."""
    import threading
    import time

    bench = load_bench()
    spans: dict[str, tuple[float, float]] = {}
    released: dict[str, bool] = {}

    def trial(name: str, late_s: float) -> None:
        time.sleep(late_s)  # its worker starts late
        start = time.time()
        time.sleep(0.05)  # trains
        released[name] = bench.hold_until_all_trained(
            tmp_path / "trained", name, n_trials=2, hold_s=600.0
        )
        spans[name] = (start, time.time())

    runs = [threading.Thread(target=trial, args=a) for a in (("tft-f32/0", 0.0), ("b", 0.5))]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    outcome = bench.sweep_outcome(
        _Results([[{"start": s, "end": e, "done": 1}] for s, e in spans.values()], [None] * 2)
    )
    assert outcome["most_at_once"] == 2
    assert released == {"tft-f32/0": True, "b": True}  # released by the other, not timed out

    started = time.monotonic()
    assert not bench.hold_until_all_trained(tmp_path / "alone", "only", n_trials=2, hold_s=0.3)
    assert time.monotonic() - started >= 0.3  # it held its share for the whole hold


def test_benchmark_times_fused_slots_against_the_folds_one_by_one(tmp_path: Path) -> None:
    """The GPU run's fused-slot rows, on CPU with smoke sizes: one row per K, both sides
    timed, written with the others."""
    bench = load_bench()
    args = ["--smoke", "--families", "tft", "--slots", "1", "2", "--seconds", "0.05"]
    report = bench.main([*args, "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "gpu_packing.json").read_text())["fused"]
    assert rows == report["fused"] and [r["slots"] for r in rows] == [1, 2]
    for row in rows:
        assert row["family"] == "tft" and row["precision"] == "f32"
        assert row["model_config"] == {"d_model": 8, "n_heads": 1}  # the smoke rows' tft
        assert row["ms_per_trial_step_fused"] > 0 and row["ms_per_trial_step_unfused"] > 0
        assert row["speedup"] == pytest.approx(
            row["ms_per_trial_step_unfused"] / row["ms_per_trial_step_fused"], rel=0.02
        )
        assert row["cuda_graphs"] == {"fused": False, "unfused": False}  # no CUDA here
    assert rows[1]["unfused_reason"] is None  # two folds fused (tft fuses when asked)
    assert "| tft | f32 | 2 |" in (tmp_path / "gpu_packing.md").read_text()
