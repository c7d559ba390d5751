"""Trials finished per minute: one compare sweep run ungrouped (``group_size = 1``) and
grouped (``group_size = 8``), side by side in one run, through the ``hpo`` CLI.

    .venv/bin/python bench/fused_sweep.py                      # liquid, tggn; 4 x 3 x 2
    .venv/bin/python bench/fused_sweep.py --families liquid --samples 2 --seeds 2   # shorter
    .venv/bin/python bench/fused_sweep.py --fuse on            # tggn fused on a CPU too
    .venv/bin/python bench/fused_sweep.py --gpu measured --concurrent 8   # the GPU row

The sweep: ``--families`` (liquid and tggn), ``--samples`` configurations x ``--seeds``
seeds x f32 and bf16 (compare mode, FIFO, random search), tiny shapes, 2 walk-forward
folds, 2 epochs. Every shape-changing setting is fixed (each family's tiny size, dropout
0) and only lr and weight decay are searched, so both sweeps sample the same
configurations and each trial's numbers can be compared across them: the grouped sweep
trains the seeds of a batch's configurations of one precision as one group trial (compare
mode batches configurations where only per-trial settings are searched, holding nothing).
Each sweep runs as a user runs it (``hpo sweep SPEC`` in a fresh directory: its own Ray instance and MLflow
store), so Ray's per-trial overhead is in both. Printed: wall time, trials per minute,
trial runs in MLflow, the verdict per family, and the largest per-trial difference in
the final validation Sharpe between the two sweeps (the tolerance of fused slots).

With ``--gpu`` (a share per Tune trial, or ``measured``) the trials run on this machine's
GPUs and a trials-per-GPU-hour column is added: trials finished per hour of wall time
per visible GPU (the GPUs are held the whole sweep, whatever the kernels use of them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from models import get_family
from models.base import Choice, Float, Int

HPO = Path(sys.executable).with_name("hpo")


def fixed_shapes(name: str) -> dict[str, Any]:
    """Every searched setting of family ``name`` but lr and weight decay, held: the tiny size,
    no dropout, the first choice or the low end otherwise."""
    family = get_family(name)
    fixed: dict[str, Any] = {}
    for key, dim in family.search_space.items():
        if key in family.tiny:
            fixed[key] = family.tiny[key]
        elif "dropout" in key:
            fixed[key] = 0.0
        elif isinstance(dim, Choice):
            fixed[key] = dim.options[0]
        elif isinstance(dim, Int | Float):
            fixed[key] = dim.low
    return fixed


def sweep_payload(name: str, group_size: int, args: argparse.Namespace, where: Path) -> dict:
    return {
        "name": name,
        "families": list(args.families),
        "precisions": ["f32", "bf16"],
        "compare": True,
        "samples": args.samples,
        "search": "random",
        "max_epochs": args.epochs,
        "seeds": list(range(args.seeds)),
        "max_concurrent": args.concurrent,
        "storage": str(where / "results"),
        "tracking_uri": f"sqlite:///{where / 'mlflow.db'}",
        "data": {"source": "synthetic", "n_assets": 2, "n_bars": 800},
        "walk_forward": {"n_folds": 2},
        "trainer": {
            "lookback": 16,
            "batch_size": 32,
            "max_steps_per_epoch": args.steps,
            "fuse": args.fuse,
        },
        "resources": {"cpu": 1, "gpu": args.gpu},
        "grouping": {"group_size": group_size},
        "search_space": {m: fixed_shapes(m) for m in args.families},
    }


def gpu_share(text: str) -> float | str:
    """``--gpu``: ``measured``, or a share per Tune trial (0: no GPU)."""
    if text == "measured":
        return text
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a GPU share is >= 0, got {text}")
    return value


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def run_sweep(name: str, group_size: int, args: argparse.Namespace, root: Path) -> dict:
    where = root / name
    where.mkdir()
    spec = where / "spec.yaml"
    spec.write_text(yaml.safe_dump(sweep_payload(name, group_size, args, where)))
    started = time.perf_counter()
    done = subprocess.run(
        [str(HPO), "sweep", str(spec)],
        cwd=where,
        env=dict(os.environ),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{name}: hpo sweep failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return {"wall": wall, **read_results(name, where)}


def read_results(name: str, where: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    from hpo.record import SweepRecord

    uri = f"sqlite:///{where / 'mlflow.db'}"
    client = MlflowClient(uri)
    record = SweepRecord.read(where / "results" / name, check_data=False)
    parent = client.get_run(record.parent_run_id)
    verdicts = {
        key.removeprefix("cmp.").removesuffix(".verdict"): value
        for key, value in parent.data.tags.items()
        if key.startswith("cmp.") and key.count(".") == 3 and key.endswith(".verdict")
    }
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{record.parent_run_id}'"
    )
    sharpe = {
        f"{r.data.tags['config_id']}|{r.data.tags['precision']}/{r.data.tags['seed']}": (
            r.data.metrics.get("val_sharpe")
        )
        for r in runs
    }
    sweep_dir = where / "results" / name
    tune_trials = sum(1 for d in sweep_dir.iterdir() if (d / "params.json").is_file())
    return {"runs": len(runs), "tune_trials": tune_trials, "verdicts": verdicts, "sharpe": sharpe}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["liquid", "tggn"])
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="minibatches per fold and epoch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--fuse", choices=["auto", "on", "off"], default="auto")
    parser.add_argument(
        "--gpu", type=gpu_share, default=0.0, help="GPU share per Tune trial, or 'measured'"
    )
    parser.add_argument("--concurrent", type=int, default=2, help="Tune trials at once")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each sweep, alternating; the fastest counts"
    )
    args = parser.parse_args()
    gpus = visible_gpus() if args.gpu else 0
    if args.gpu and not gpus:
        sys.exit("--gpu needs a CUDA GPU on this machine (torch sees none)")
    n_trials = len(args.families) * args.samples * args.seeds * 2
    print(
        f"compare sweep: {', '.join(args.families)} x {args.samples} configurations x "
        f"{args.seeds} seeds x f32, bf16 = {n_trials} trials; {args.epochs} epochs, "
        f"{args.steps} steps, fuse = {args.fuse}"
    )
    with tempfile.TemporaryDirectory(prefix="hpo-fused-sweep-") as tmp:
        root = Path(tmp)
        runs: dict[str, list[dict[str, Any]]] = {"alone": [], "grouped": []}
        for i in range(args.repeat):  # alternating, so drift on a shared machine hits both
            runs["alone"].append(run_sweep(f"alone{i}", 1, args, root))
            runs["grouped"].append(run_sweep(f"grouped{i}", args.group_size, args, root))
        alone, grouped = (min(runs[k], key=lambda r: r["wall"]) for k in ("alone", "grouped"))
        if args.repeat > 1:
            for name, results in runs.items():
                walls = ", ".join(f"{r['wall']:.1f}" for r in results)
                print(f"{name}: wall s {walls}")
    per_gpu = " trials/GPU-hour |" if gpus else ""
    print(f"| group_size | Tune trials | wall s | trials/min |{per_gpu} trial runs | verdicts |")
    print("| ---: | ---: | ---: | ---: |" + (" ---: |" if gpus else "") + " ---: | --- |")
    for size, result in ((1, alone), (args.group_size, grouped)):
        rate = n_trials / (result["wall"] / 60)
        verdicts = json.dumps(result["verdicts"], sort_keys=True)
        gpu_hour = f" {n_trials * 3600 / (result['wall'] * gpus):.0f} |" if gpus else ""
        print(
            f"| {size} | {result['tune_trials']} | {result['wall']:.1f} | {rate:.1f} |"
            f"{gpu_hour} {result['runs']} | {verdicts} |"
        )
    print(f"ratio (trials/min grouped / alone): {alone['wall'] / grouped['wall']:.2f}x")
    shared = set(alone["sharpe"]) & set(grouped["sharpe"])
    diffs = [
        abs(alone["sharpe"][k] - grouped["sharpe"][k])
        for k in shared
        if alone["sharpe"][k] is not None and grouped["sharpe"][k] is not None
    ]
    print(
        f"trials in both: {len(shared)}/{n_trials}; largest |val Sharpe difference|: "
        f"{max(diffs) if diffs else float('nan'):.2e}; same verdicts: "
        f"{alone['verdicts'] == grouped['verdicts']}"
    )


if __name__ == "__main__":
    main()
