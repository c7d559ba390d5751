"""GPU packing benchmark: every family in f32 and bf16 at its default trial size -- measured
peak vs the CPU estimate, GPU share, trials per GPU, and training steps/s -- then one
packed sweep of all of them on the GPU, counting OOMs.

    .venv/bin/python bench/gpu_packing.py                  # one CUDA GPU, under 8 minutes
    .venv/bin/python bench/gpu_packing.py --smoke          # CPU, estimates only, dqn + tft, tiny
    .venv/bin/python bench/gpu_packing.py --families dqn,tft --out bench/results

Writes OUT/gpu_packing.json and OUT/gpu_packing.md (OUT defaults to bench/results).

The packed sweep (on by default with CUDA, ``--sweep`` / ``--no-sweep`` to choose) starts
a local Ray, profiles every (family, precision) in a Ray task on the GPU
(:class:`cluster.packing_plan.ClusterPacker`, as a sweep does), prints the plan, then runs
one short trial of each through the real trainable at its planned share, all at once
where they fit, and reports the OOMs (the target is 0) and the most trials that ran at
once.

For each (family, precision) it runs the profiler twice: on the CPU (the estimate a driver
without a GPU packs with) and, on CUDA, measured (``max_memory_allocated`` / ``reserved``
of a warm step and validation forward on every fold). The fraction uses the measurement
where there is one. Steps/s counts optimizer steps of fold 0 through the trainer's own
step (rl: collect + learn, as in training) over ``--seconds`` after one warm call.
Families whose module does not import are listed as skipped, not failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from cluster.packing import DEFAULT_HEADROOM, RAY_GPU_STEPS, plan
from cluster.profiler import MemoryProfile, MiB, profile_trial, profiling_config
from models import family_names, get_family
from trainables.config import DataConfig, TrainConfig, TrialBase, TrialConfig

PRECISIONS = ("f32", "bf16")
SMOKE_FAMILIES = ("dqn", "tft")
# Smoke: tiny data and models, so the CPU run takes seconds.
SMOKE_TRAINER = {"n_folds": 1, "lookback": 16, "batch_size": 32}
SMOKE_DATA = DataConfig(n_bars=600, n_assets=2)
SMOKE_MODEL = {
    "dqn": {"hidden": 32, "buffer_capacity": 2048, "learning_starts": 64},
    "tft": {"d_model": 8, "n_heads": 1},
}


def trial_config(family: str, precision: str, smoke: bool) -> TrainConfig:
    """The trainer config a sweep trial of ``family`` gets, decoded as the trainable does
    (the adapter's defaults; smoke: tiny shapes)."""
    trial = TrialConfig(
        model=family,
        precision=precision,
        seed=0,
        params=SMOKE_MODEL.get(family, {}) if smoke else {},
        base=TrialBase(
            epochs=1,
            trainer=SMOKE_TRAINER if smoke else {},
            data=SMOKE_DATA if smoke else DataConfig(),
        ),
    )
    return trial.train_config()


def steps_per_second(
    config: TrainConfig, device: torch.device, seconds: float, per_call: int = 20
) -> tuple[float, bool]:
    """Optimizer steps per second on fold 0, after one warm call, and whether the steps
    were replayed from a CUDA graph; each timed call runs ``per_call`` minibatches (rl:
    ``per_call // 5`` collect-and-learn cycles)."""
    from trainables.trainer import Trainer

    cfg = profiling_config(config, device).replace(
        max_steps_per_epoch=per_call, rl_iterations=max(1, per_call // 5)
    )
    trainer = Trainer(cfg, device=device)
    run = trainer.folds[0]
    step = trainer._train_rl if trainer.is_rl else trainer._train_forecast

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(64):  # warm, and (rl) until the learner has started learning
        step(run)
        if trainer.global_step > 0:
            break
    sync()
    start, first = time.perf_counter(), trainer.global_step
    while True:
        step(run)
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            replayed = run.step is not None and run.step.replaying
            return (trainer.global_step - first) / elapsed, replayed


def mib(n: int | None) -> float | None:
    return None if n is None else round(n / MiB, 2)


def bench_one(
    family: str, precision: str, device: torch.device, args: argparse.Namespace
) -> dict[str, Any]:
    config = trial_config(family, precision, args.smoke)
    estimate = profile_trial(config, device="cpu", measure=False)
    measured: MemoryProfile | None = None
    if device.type == "cuda":
        measured = profile_trial(config, device=device, measure=True)
    packing = plan(measured or estimate, args.headroom, args.grid)
    per_call = 2 if args.smoke else 20
    # trainer.cuda_graphs = auto: replayed from CUDA graphs where the family's step is static
    speed, replayed = steps_per_second(config, device, args.seconds, per_call=per_call)
    eager = speed
    if replayed:  # the same step eagerly, side by side: what the graphs save
        eager, _ = steps_per_second(
            config.replace(cuda_graphs="off"), device, args.seconds, per_call=per_call
        )
    row: dict[str, Any] = {
        "family": family,
        "precision": estimate.precision,
        "n_params": estimate.n_params,
        "estimate_mib": mib(estimate.estimated_peak_bytes),
        "estimate_components_mib": {k: mib(v) for k, v in estimate.components().items()},
        "measured_allocated_mib": mib(measured.measured_allocated_bytes) if measured else None,
        "measured_reserved_mib": mib(measured.measured_reserved_bytes) if measured else None,
        "context_mib": mib((measured or estimate).context_bytes),
        "fraction": packing.fraction,
        "trials_per_gpu": packing.trials_per_gpu,
        "trials_per_gpu_by_memory": packing.trials_per_gpu_unrounded,
        "steps_per_s": round(speed, 2),
        "cuda_graphs": replayed,
        "ms_per_step": round(1000.0 / max(speed, 1e-9), 3),
        "ms_per_step_eager": round(1000.0 / max(eager, 1e-9), 3),
        "device": measured.device_name if measured else "cpu (estimate only)",
    }
    if measured is not None and measured.measured_allocated_bytes:
        row["estimate_error"] = (
            estimate.estimated_peak_bytes / measured.measured_allocated_bytes - 1
        )
        row["on_device_estimate_error"] = measured.estimate_error
    return row


def markdown(report: dict[str, Any]) -> str:
    def cell(value: Any, fmt: str = "{}") -> str:
        return "—" if value is None else fmt.format(value)

    lines = [
        f"# GPU packing: {report['device']} (torch {report['torch']})",
        "",
        f"headroom {report['headroom']}, shares at 1/{report['grid']}; "
        f"{'GPU measured' if report['measured'] else 'NOT MEASURED ON A GPU: CPU estimates only'}",
        "",
        "| family | precision | params | estimate MiB | allocated MiB | reserved MiB | "
        "est. error | context MiB | fraction | trials/GPU | by memory | steps/s | "
        "ms/step (graphs) | ms/step (eager) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['family']} | {r['precision']} | {r['n_params']:,} | {cell(r['estimate_mib'])} | "
            f"{cell(r['measured_allocated_mib'])} | {cell(r['measured_reserved_mib'])} | "
            f"{cell(r.get('estimate_error'), '{:+.1%}')} | {cell(r['context_mib'])} | "
            f"{r['fraction']:g} | {r['trials_per_gpu']} | {r['trials_per_gpu_by_memory']} | "
            f"{r['steps_per_s']:.1f} | "
            f"{cell(r['ms_per_step'] if r['cuda_graphs'] else None)} | {r['ms_per_step_eager']} |"
        )
    lines += [
        "",
        "| family | bf16/f32 peak | bf16/f32 trials per GPU | bf16/f32 steps/s "
        "| bf16/f32 ms/step eager |",
    ]
    lines.append("|---|---:|---:|---:|---:|")
    for family, ratio in report["ratios"].items():
        lines.append(
            f"| {family} | {ratio['peak']:.2f} | {ratio['trials']:.2f} | {ratio['steps']:.2f} "
            f"| {ratio['eager_ms']:.2f} |"
        )
    sweep = report.get("sweep")
    if sweep:
        lines += [
            "",
            f"Packed sweep: {sweep['trials']} trials, {sweep['ooms']} OOMs, {sweep['errors']} "
            f"errors, at most {sweep['most_at_once']} at once, {sweep['elapsed_s']} s",
            "",
            "```",
            sweep["plan"],
            "```",
        ]
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


class _TrialOf:
    """The resources callable of the bench's trials, whose config is ``{"trial": dict}``."""

    def __init__(self, packer: Any) -> None:
        self.packer = packer

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.packer(config["trial"])


def _bench_trial(config: dict[str, Any]) -> None:
    import time as clock

    from ray import tune

    from trainables.trial import run_trial

    start = clock.time()
    run_trial(config["trial"])
    tune.report({"start": start, "end": clock.time(), "done": 1})


def packed_sweep(
    families: tuple[str, ...], smoke: bool, headroom: float, storage: Path
) -> dict[str, Any]:
    """One short trial per (family, precision) at its planned share, on a local Ray."""
    import ray
    from ray import tune

    from cluster.gpu_types import cluster_gpu_types
    from cluster.packing_plan import ClusterPacker, plan_rows, render_plan
    from cluster.vram_table import SharedVramCache

    if __name__ != "__main__" and __name__ in sys.modules:  # imported by name: Ray's workers
        from ray import cloudpickle  # cannot import bench/, so ship its functions by value

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if not ray.is_initialized():
        from cluster.connect import ensure_ray

        ensure_ray()
    packer = ClusterPacker(
        cluster_gpu_types(),
        headroom=headroom,
        cpu_per_trial=0 if smoke else 1,
        cache=SharedVramCache.at(str(storage)),
    )
    trainer = {**(SMOKE_TRAINER if smoke else {}), "max_steps_per_epoch": 10, "rl_iterations": 4}
    trials = [
        TrialConfig(
            model=family,
            precision=precision,
            seed=0,
            params=SMOKE_MODEL.get(family, {}) if smoke else {},
            base=TrialBase(epochs=1, trainer=trainer, data=SMOKE_DATA if smoke else DataConfig()),
            member=f"{precision}/0",
        )
        for family in families
        for precision in PRECISIONS
    ]
    started = time.perf_counter()
    rows = plan_rows(packer, [t.train_config() for t in trials])
    tuner = tune.Tuner(
        tune.with_resources(_bench_trial, _TrialOf(packer)),
        param_space={"trial": tune.grid_search([t.to_dict() for t in trials])},
        run_config=tune.RunConfig(name="gpu-packing", storage_path=str(storage), verbose=0),
    )
    results = tuner.fit()
    metrics = [results[i].metrics or {} for i in range(len(results))]
    spans = [(m["start"], m["end"]) for m in metrics if "start" in m]
    most = max((sum(s <= t < e for s, e in spans) for t, _ in spans), default=0)
    return {
        "trials": len(trials),
        "ooms": sum(int(m.get("oom", 0)) for m in metrics),
        "errors": results.num_errors,
        "most_at_once": most,
        "plan_rows": rows,
        "plan": render_plan(rows, headroom),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU estimates, dqn + tft, tiny")
    parser.add_argument("--families", default=None, help="comma-separated (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM)
    parser.add_argument("--grid", type=int, default=RAY_GPU_STEPS, help="steps per GPU")
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the packed sweep (default: with CUDA)",
    )
    parser.add_argument("--seconds", type=float, default=None, help="timing per row")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    args.seconds = args.seconds if args.seconds is not None else (0.3 if args.smoke else 3.0)
    torch.set_num_threads(args.threads or (1 if args.smoke else 4))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.families:
        families = tuple(args.families.split(","))
    else:
        families = SMOKE_FAMILIES if args.smoke else family_names()

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for family in families:
        try:
            get_family(family)
        except Exception as exc:  # a family module not written yet, or broken
            skipped.append(f"{family} (cannot import: {type(exc).__name__}: {exc})")
            continue
        for precision in PRECISIONS:
            try:
                rows.append(bench_one(family, precision, device, args))
            except Exception as exc:
                skipped.append(f"{family}/{precision} ({type(exc).__name__}: {exc})")
            print(f"{family}/{precision} done at {time.perf_counter() - started:.0f}s", flush=True)

    sweep = None
    if args.sweep or (args.sweep is None and device.type == "cuda"):
        with tempfile.TemporaryDirectory(prefix="hpo-bench-packing-") as storage:
            sweep = packed_sweep(
                tuple(f for f in families if not any(f in s for s in skipped)),
                args.smoke,
                args.headroom,
                Path(storage),
            )
        print(sweep["plan"], flush=True)

    ratios: dict[str, dict[str, float]] = {}
    by_key = {(r["family"], r["precision"]): r for r in rows}
    for family in families:
        f32, bf16 = by_key.get((family, "f32")), by_key.get((family, "bf16"))
        if f32 and bf16:
            peak = "measured_reserved_mib" if f32["measured_reserved_mib"] else "estimate_mib"
            ratios[family] = {
                "peak": bf16[peak] / f32[peak],
                "trials": bf16["trials_per_gpu"] / f32["trials_per_gpu"],
                "steps": bf16["steps_per_s"] / max(f32["steps_per_s"], 1e-9),
                "eager_ms": bf16["ms_per_step_eager"] / max(f32["ms_per_step_eager"], 1e-9),
            }
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "measured": device.type == "cuda",
        "torch": torch.__version__,
        "headroom": args.headroom,
        "grid": args.grid,
        "rows": rows,
        "ratios": ratios,
        "skipped": skipped,
        "sweep": sweep,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_packing.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu_packing.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
