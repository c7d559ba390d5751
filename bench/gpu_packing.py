"""GPU packing benchmark: every family in f32 and bf16 at its default trial size -- measured
peak vs the CPU estimate, GPU share, trials per GPU, and training steps/s -- then one
packed sweep of all of them on the GPU, counting OOMs.

    .venv/bin/python bench/gpu_packing.py --require-cuda --out "$OUT"   # one GPU, < 8 minutes
    .venv/bin/python bench/gpu_packing.py --smoke          # CPU, estimates only, dqn + tft, tiny
    .venv/bin/python bench/gpu_packing.py --families dqn,tft --out bench/results
    .venv/bin/python bench/gpu_packing.py --smoke --families tft --slots 1 2   # fused rows

Writes OUT/gpu_packing.json and OUT/gpu_packing.md (OUT defaults to bench/results) after
every row, so a run stopped by its time limit keeps what it measured; each row is also
printed as one JSON line. ``--budget-s`` (default 420) is the whole run: a row starts only
if it (as long as the slowest so far) and the packed sweep's reserve still fit, the sweep
only if its reserve fits, and Tune stops the sweep's trials at the budget's end. The
sweep's Tune storage (with its trials' error logs) is kept under OUT; a failed sweep is
recorded with its traceback.

The packed sweep (on by default with CUDA, ``--sweep`` / ``--no-sweep`` to choose) reports
the OOMs (the target is 0) and the most trials that ran at once. ``--seconds`` sets how
long steps/s is timed. Fused-slot rows (``--slots``; 1, 8 and 32 with CUDA) time a
trial-step of K folds fused against the same folds stepped one after another, in bf16 on
a GPU. Families whose module does not import are listed as skipped, not failed. What each row and the sweep measure: docs/packing.md#the-packing-benchmark
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from cluster.packing import DEFAULT_HEADROOM, RAY_GPU_STEPS, plan
from cluster.profiler import MemoryProfile, MiB, profile_trial, profiling_config
from models import family_names, get_family
from trainables.config import DataConfig, TrainConfig, TrialBase, TrialConfig

PRECISIONS = ("f32", "bf16")
SWEEP_RESERVE_S = 150.0  # what the packed sweep needs of the budget (Ray, 20 profiles, trials)
# All profiling tasks together (one ray.get): a sweep waits up to 900 s, this run cannot.
PROFILING_TIMEOUT_S = 90.0
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
        family=family,
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
    """Optimizer steps per second (one per fold stepped) of the trial's first step unit
    (the fused folds, or fold 0), after one warm call, and whether the steps were replayed
    from a CUDA graph; each timed call runs ``per_call`` minibatches (rl: ``per_call // 5``
    collect-and-learn cycles)."""
    from trainables.trainer import Trainer

    cfg = profiling_config(config, device).replace(
        max_steps_per_epoch=per_call, rl_iterations=max(1, per_call // 5)
    )
    trainer = Trainer(cfg, device=device)
    run = trainer.step_units[0]

    def step(unit: Any) -> None:
        trainer.train_unit(unit)

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


def ms_per_trial_step(
    config: TrainConfig, device: torch.device, seconds: float, per_call: int
) -> tuple[float, bool, str | None]:
    """ms per trial-step (one step of each fold) of ``config``'s trainer, whether every
    step unit replayed a CUDA graph, and why the folds did not fuse (None where they did,
    or were not asked to); each call runs ``per_call`` batches of each fold."""
    from trainables.trainer import Trainer

    trainer = Trainer(config, device=device)
    units = trainer.step_units
    unfused_reason = (trainer.unfused_reason or None) if config.fuse != "off" else None

    def call() -> None:
        for unit in units:
            trainer.train_unit(unit)

    for _ in range(2):  # warm-up, and CUDA graph capture (after 3 eager steps)
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            replayed = all(u.step is not None and u.step.replaying for u in units)
            return elapsed * 1e3 / (calls * per_call), replayed, unfused_reason


def fused_row(
    family: str,
    precision: str,
    k: int,
    device: torch.device,
    seconds: float,
    per_call: int,
    smoke: bool = False,
) -> dict[str, Any]:
    """ms per trial-step (a step of each of K folds) fused and unfused, CUDA graphs on
    where the family's step is static: what fusing saves at K slots (smoke: the tiny
    model, window and data of the other smoke rows)."""
    model_config: dict[str, Any] = {}
    shape: dict[str, Any] = {}
    data = DataConfig(n_bars=max(2000, 250 * k))
    if smoke:
        model_config = SMOKE_MODEL.get(family, {})
        shape = {"lookback": SMOKE_TRAINER["lookback"], "batch_size": SMOKE_TRAINER["batch_size"]}
        data = DataConfig(n_bars=max(SMOKE_DATA.n_bars, 250 * k), n_assets=SMOKE_DATA.n_assets)
    timings: dict[str, tuple[float, bool, str | None]] = {}
    for fuse in ("on", "off"):
        config = TrainConfig(
            family=family,
            precision=precision,
            model_config=model_config,
            epochs=1,
            n_folds=k,
            val_fraction=0.5 / max(k, 4),
            max_steps_per_epoch=per_call,
            fuse=fuse,
            device=str(device),
            data=data,
            **shape,
        )
        timings[fuse] = ms_per_trial_step(config, device, seconds, per_call)
    (fused, fused_graphs, why), (unfused, unfused_graphs, _) = timings["on"], timings["off"]
    return {
        "family": family,
        "precision": precision,
        "slots": k,
        "model_config": model_config,  # the family's defaults where empty
        "ms_per_trial_step_fused": round(fused, 3),
        "ms_per_trial_step_unfused": round(unfused, 3),
        "speedup": round(unfused / fused, 2),
        "cuda_graphs": {"fused": fused_graphs, "unfused": unfused_graphs},
        # A fused side that could not fuse (the try-out step failed: its reason) times the
        # folds one after another, and its speedup is about 1.
        "unfused_reason": why,
    }


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
        "context_measured": (measured or estimate).context_measured,  # else the allowance
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

    gpu = report.get("gpu") or {}
    lines = [
        f"# GPU packing: {report['device']} (torch {report['torch']})",
        "",
        *([f"GPU: {', '.join(f'{k} {v}' for k, v in gpu.items())}", ""] if gpu else []),
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
    if report.get("fused"):
        lines += [
            "",
            "Fused slots: ms per trial-step (one step of each of K folds), CUDA graphs on "
            "where the step is static",
            "",
            "| family | precision | K | fused ms | unfused ms | speedup | graphs | not fused "
            "because |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for m in report["fused"]:
            lines.append(
                f"| {m['family']} | {m['precision']} | {m['slots']} | "
                f"{m['ms_per_trial_step_fused']} | {m['ms_per_trial_step_unfused']} | "
                f"{m['speedup']}x | {m['cuda_graphs']} | {m.get('unfused_reason') or ''} |"
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
        lines += [f"- {failure}" for failure in sweep.get("failures", [])]
    if report.get("sweep_error"):
        lines += ["", "Packed sweep did not run to its end:", "```", report["sweep_error"], "```"]
    if report.get("sweep_skipped"):
        lines += ["", f"Packed sweep not run: {report['sweep_skipped']}"]
    if report["skipped"]:
        lines += ["", "Skipped: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


class _TrialOf:
    """The resources callable of the bench's trials, whose config is ``{"trial": dict}``."""

    def __init__(self, packer: Any) -> None:
        self.packer = packer

    def __call__(self, config: dict[str, Any]) -> Any:
        return self.packer(config["trial"])


def sweep_outcome(results: Any) -> dict[str, Any]:
    """OOMs, errors and overlap of the bench sweep's trials. An OOM is a result the trial
    reports and then returns from (``run_trial`` hands the searcher a retry share), so it
    is found in each trial's whole metric history, not in its last result (the bench's
    own ``done`` report comes after it)."""
    ooms, failures, spans = 0, [], []
    for i in range(len(results)):
        result = results[i]
        history = result.metrics_dataframe
        if history is not None and "oom" in history:
            oomed = history["oom"].fillna(0) > 0
            ooms += int(oomed.any())
            if oomed.any() and "failure_reason" in history:
                failures.append(str(history.loc[oomed, "failure_reason"].iloc[-1]))
        if result.error is not None:
            failures.append(f"{type(result.error).__name__}: {result.error}"[:2000])
        last = result.metrics or {}
        if "start" in last:
            spans.append((last["start"], last["end"]))
    most = max((sum(s <= t < e for s, e in spans) for t, _ in spans), default=0)
    return {
        "ooms": ooms,
        "errors": results.num_errors,
        "failures": failures,
        "most_at_once": most,
    }


HOLD_S = 60.0  # the longest a trained trial waits for the sweep's others to train


def hold_until_all_trained(folder: Path, trial: str, n_trials: int, hold_s: float) -> bool:
    """Marks this trial trained and waits (at most ``hold_s``) until all ``n_trials`` are;
    whether they all were (False: the hold ran out).

    A trial keeps its GPU share while it waits, so the sweep's "at most N at once" counts
    the trials Ray admitted together, not those whose short runs happened to overlap: a
    smoke trial trains in seconds, about what a loaded machine takes to start the next
    trial's worker. Trials Ray could not admit together still run one after another (the
    first waits ``hold_s`` in vain), and the count says so."""
    import time as clock

    folder.mkdir(parents=True, exist_ok=True)
    (folder / trial.replace("/", "-")).touch()
    deadline = clock.monotonic() + hold_s
    while sum(1 for _ in folder.iterdir()) < n_trials:
        if clock.monotonic() >= deadline:
            return False
        clock.sleep(0.1)
    return True


def _bench_trial(config: dict[str, Any]) -> None:
    import time as clock

    from ray import tune

    from cluster.trial_share import PackedShare
    from trainables.trial import run_trial

    start = clock.time()
    hold, trial = config["hold"], config["trial"]
    name = f"{trial['family']}-{trial['precision']}/{trial['seed']}"
    try:
        run_trial(trial, PackedShare())
    except BaseException:  # counts as trained, so no other waits for it; fails at once
        hold_until_all_trained(Path(hold["dir"]), name, hold["n"], hold_s=0.0)
        raise
    hold_until_all_trained(Path(hold["dir"]), name, hold["n"], hold["s"])
    tune.report({"start": start, "end": clock.time(), "done": 1})


def packed_sweep(
    families: tuple[str, ...],
    smoke: bool,
    headroom: float,
    storage: Path,
    deadline: float | None = None,
) -> dict[str, Any]:
    """One short trial per (family, precision) at its planned share, on a local Ray;
    Tune stops the trials at ``deadline`` (a ``time.perf_counter`` value) and the outcome
    covers what ran by then."""
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

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network on GPU hosts
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else None
        ensure_ray(num_gpus=gpus)
    packer = ClusterPacker(
        cluster_gpu_types(),
        headroom=headroom,
        cpu_per_trial=0 if smoke else 1,
        cache=SharedVramCache.at(str(storage)),
        profile_timeout_s=PROFILING_TIMEOUT_S,
    )
    trainer = {**(SMOKE_TRAINER if smoke else {}), "max_steps_per_epoch": 10, "rl_iterations": 4}
    trials = [
        TrialConfig(
            family=family,
            precision=precision,
            seed=0,
            params=SMOKE_MODEL.get(family, {}) if smoke else {},
            base=TrialBase(epochs=1, trainer=trainer, data=SMOKE_DATA if smoke else DataConfig()),
        )
        for family in families
        for precision in PRECISIONS
    ]
    started = time.perf_counter()
    rows = plan_rows(packer, [t.train_config() for t in trials])
    left = None if deadline is None else max(30.0, deadline - time.perf_counter())
    hold = {"dir": str(storage / "trained"), "n": len(trials), "s": min(HOLD_S, left or HOLD_S)}
    tuner = tune.Tuner(
        tune.with_resources(_bench_trial, _TrialOf(packer)),
        param_space={"trial": tune.grid_search([t.to_dict() for t in trials]), "hold": hold},
        tune_config=tune.TuneConfig(time_budget_s=left),
        run_config=tune.RunConfig(name="gpu-packing", storage_path=str(storage), verbose=0),
    )
    results = tuner.fit()
    return {
        "trials": len(trials),
        **sweep_outcome(results),
        "plan_rows": rows,
        "plan": render_plan(rows, headroom),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def gpu_facts(device: torch.device) -> dict[str, Any]:
    """What the run should know about its GPU first: packing several trial processes on
    one GPU needs the Default compute mode (Exclusive_Process admits one)."""
    if device.type != "cuda":
        return {}
    from cluster.profiler import nvml_handle

    facts: dict[str, Any] = {
        "name": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda,
        "total_mib": round(torch.cuda.get_device_properties(device).total_memory / MiB),
    }
    try:
        import pynvml

        mode = pynvml.nvmlDeviceGetComputeMode(nvml_handle(device))
        modes = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
        facts["compute_mode"] = modes.get(mode, f"unknown ({mode})")
        pynvml.nvmlShutdown()
    except Exception as exc:  # no NVML here: the run goes on without the fact
        facts["compute_mode"] = f"unknown ({type(exc).__name__}: {exc})"
    return facts


def write_report(out: Path, report: dict[str, Any]) -> None:
    """Both files, replaced whole: called after every row, so a run stopped by its time
    limit keeps every row it measured."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("gpu_packing.json", json.dumps(report, indent=1)),
        ("gpu_packing.md", markdown(report)),
    ):
        partial = out / f".{name}.partial"
        partial.write_text(text)
        partial.replace(out / name)


def bf16_ratios(rows: list[dict[str, Any]], families: tuple[str, ...]) -> dict[str, Any]:
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
    return ratios


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
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help=f"stop starting rows when the time left would not fit them and the sweep "
        f"({SWEEP_RESERVE_S:.0f} s)",
    )
    parser.add_argument(
        "--slots",
        nargs="*",
        type=int,
        default=None,
        help="fused-slot rows at these K (default: 1 8 32 with CUDA, none without)",
    )
    parser.add_argument(
        "--require-cuda",
        action="store_true",
        help="stop at once unless torch sees a CUDA GPU (a GPU run must not fall back to CPU)",
    )
    args = parser.parse_args(argv)
    if args.require_cuda and not (torch.version.cuda and torch.cuda.is_available()):
        raise SystemExit(
            f"--require-cuda: torch {torch.__version__} sees no CUDA GPU "
            f"(torch.version.cuda = {torch.version.cuda}); install a CUDA build of torch"
        )
    args.seconds = args.seconds if args.seconds is not None else (0.3 if args.smoke else 3.0)
    torch.set_num_threads(args.threads or (1 if args.smoke else 4))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.families:
        families = tuple(args.families.split(","))
    else:
        families = SMOKE_FAMILIES if args.smoke else family_names()
    run_sweep = bool(args.sweep or (args.sweep is None and device.type == "cuda"))

    started = time.perf_counter()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gpu": gpu_facts(device),
        "measured": device.type == "cuda",
        "torch": torch.__version__,
        "headroom": args.headroom,
        "grid": args.grid,
        "rows": [],
        "ratios": {},
        "skipped": [],
        "sweep": None,
        "fused": [],
        "elapsed_s": 0.0,
    }
    print(json.dumps({"gpu": report["gpu"] or "cpu"}), flush=True)
    rows: list[dict[str, Any]] = report["rows"]
    skipped: list[str] = report["skipped"]
    left_out: set[str] = set()  # families the sweep leaves out: a row failed or was skipped
    row_s = 0.0  # the slowest row so far: what the next one is assumed to need
    reserve = SWEEP_RESERVE_S if run_sweep else 0.0

    def fits(needed_s: float) -> bool:
        """The one budget rule: what is started must end, with the sweep's reserve after
        it, within ``--budget-s``."""
        return time.perf_counter() - started + needed_s + reserve <= args.budget_s

    for family in families:
        try:
            get_family(family)
        except Exception as exc:  # a family module not written yet, or broken
            skipped.append(f"{family} (cannot import: {type(exc).__name__}: {exc})")
            left_out.add(family)
            continue
        for precision in PRECISIONS:
            if not fits(row_s):
                used = time.perf_counter() - started
                skipped.append(f"{family}/{precision} (time budget: {used:.0f} s used)")
                left_out.add(family)
                continue
            row_start = time.perf_counter()
            try:
                rows.append(bench_one(family, precision, device, args))
                print(json.dumps(rows[-1]), flush=True)
            except Exception as exc:
                skipped.append(f"{family}/{precision} ({type(exc).__name__}: {exc})")
                left_out.add(family)
            row_s = max(row_s, time.perf_counter() - row_start)
            report["ratios"] = bf16_ratios(rows, families)
            report["elapsed_s"] = round(time.perf_counter() - started, 1)
            write_report(args.out, report)

    # Fused slots, bf16 (what a GPU trial runs): ms per trial-step at each K, fused and
    # not, for the forecast families; a row starts only if it fits like the others.
    ks = args.slots if args.slots is not None else ([1, 8, 32] if device.type == "cuda" else [])
    for family in [f for f in families if f not in left_out and get_family(f).fuses]:
        for k in ks:
            if not fits(row_s):
                skipped.append(f"{family} K={k} fused slots (time budget)")
                continue
            row_start = time.perf_counter()
            try:
                report["fused"].append(
                    fused_row(
                        family,
                        "bf16" if device.type == "cuda" else "f32",
                        k,
                        device,
                        args.seconds,
                        per_call=2 if args.smoke else 20,
                        smoke=args.smoke,
                    )
                )
                print(json.dumps(report["fused"][-1]), flush=True)
            except Exception as exc:
                skipped.append(f"{family} K={k} fused slots ({type(exc).__name__}: {exc})")
            row_s = max(row_s, time.perf_counter() - row_start)
            report["elapsed_s"] = round(time.perf_counter() - started, 1)
            write_report(args.out, report)

    if run_sweep:
        reserve = 0.0  # from here on the reserve is the sweep's own time
        chosen = tuple(f for f in families if f not in left_out)
        used = time.perf_counter() - started
        if not chosen:
            report["sweep_skipped"] = "no family has both rows measured"
        elif not fits(SWEEP_RESERVE_S):
            report["sweep_skipped"] = f"the time budget was spent ({used:.0f} s used)"
        else:
            storage = args.out / "sweep-storage"
            shutil.rmtree(storage, ignore_errors=True)  # an earlier run's profiles: measure anew
            try:
                report["sweep"] = packed_sweep(
                    chosen,
                    args.smoke,
                    args.headroom,
                    storage,
                    deadline=started + args.budget_s,
                )
                print(report["sweep"]["plan"], flush=True)
            except Exception:
                report["sweep_error"] = traceback.format_exc()
                print(report["sweep_error"], file=sys.stderr, flush=True)

    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    write_report(args.out, report)
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
