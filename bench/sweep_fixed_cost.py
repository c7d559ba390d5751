"""The fixed cost of a sweep: a one-trial `hpo sweep` beside Ray's own start and stop,
measured side by side in one run, with where the sweep's time goes.

    .venv/bin/python bench/sweep_fixed_cost.py             # 5 rounds (~2 min)
    .venv/bin/python bench/sweep_fixed_cost.py --rounds 1  # a quick look

Each round runs, one after the other in fresh processes:

* Ray alone: ``python -c "import ray; ray.init(...); ray.shutdown()"`` with the arguments
  the embedded sweep gives it (2 CPUs, no dashboard, loopback);
* a one-trial sweep: ``hpo sweep`` of one tiny tft trial (one fold, one epoch of 3 steps,
  f32) on the embedded local Ray with a new MLflow SQLite store, as ``make demo`` runs.

The sweep runs under a wrapper that times the steps of ``hpo sweep`` (wrapping the
functions the CLI calls, no change to the product), so the breakdown and the total come
from the same run. The rounds alternate the two sides, and medians are printed, because
this machine's wall times drift between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable

RAY_ALONE = (
    "import os; os.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0'); import ray; "
    "ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, "
    "logging_level='WARNING'); ray.shutdown()"
)

SPEC = """\
name = "{name}"
families = ["tft"]
precisions = ["f32"]
samples = 1
search = "random"
scheduler = "fifo"
max_epochs = 1
storage = "{storage}"
tracking_uri = "sqlite:///{db}"

[data]
n_assets = 2
n_bars = 400

[walk_forward]
n_folds = 1

[trainer]
lookback = 16
batch_size = 32
max_steps_per_epoch = 3

[search_space.tft]
d_model = 8
n_heads = 1
lstm_layers = 1
"""

# The steps of `hpo sweep`, in the order they run: (module, attribute, label). The wrapper
# records each call's start and end on the process clock (time.time, as the parent's).
STEPS = (
    ("hpo.cli._options", "load_sweep_spec", "spec parsed"),
    ("hpo.sweep", "_join_cluster", "Ray started"),
    ("mlflow.tracking", "MlflowClient.__init__", "MLflow clients created"),
    ("hpo.tracking_store", "create_schema", "store schema (thread)"),
    ("hpo.sweep", "sweep_resources", "resources"),
    ("hpo.sweep", "sweep_plan", "packing plan"),
    ("hpo.tracking", "start_sweep_run", "MLflow store + parent run"),
    ("hpo.sweep", "build_tuner", "tuner built"),
    ("ray.tune", "Tuner.fit", "Tune ran the trial"),
    ("hpo.sweep", "finish_sweep", "summary + MLflow"),
    ("hpo.cli._sweeps", "_print_sweep_result", "tables printed"),
)

WRAPPER = """
import importlib, json, sys, time, atexit
t0 = float(sys.argv[1]); out = sys.argv[2]; steps = json.loads(sys.argv[3])
marks = {"python started": time.time()}
spans = []
exits = []
_register = atexit.register
def register(func, *a, **k):  # time each exit handler (Ray's shutdown, MLflow's, ...)
    def timed_exit(*aa, **kk):
        start = time.time()
        marks.setdefault("first exit handler", start)
        try:
            return func(*aa, **kk)
        finally:
            exits.append((getattr(func, "__qualname__", repr(func)), time.time() - start))
    _register(timed_exit, *a, **k)
    return func
atexit.register = register
def dump():
    marks["exit handlers done"] = time.time()
    with open(out, "w") as f:
        json.dump({"t0": t0, "marks": marks, "spans": spans, "exits": exits}, f)
_register(dump)  # registered first: runs last, after the handlers it times
import hpo.cli
from hpo.cli import _app
if hasattr(_app, "_exit_now"):  # the program ends in its last handler: dump first
    _exit_now = _app._exit_now
    def dump_then_exit(status):
        dump()
        _exit_now(status)
    _app._exit_now = dump_then_exit
for module, attr, label in steps:
    mod = importlib.import_module(module) if "." not in attr else None
    if mod is None:  # a method: Class.name
        cls_name, attr = attr.split(".")
        mod = getattr(importlib.import_module(module), cls_name)
    original = getattr(mod, attr, None)
    if original is None:  # a step this version of hpo does not have
        continue
    def timed(*a, __f=original, __label=label, **k):
        start = time.time()
        try:
            return __f(*a, **k)
        finally:
            spans.append((__label, start, time.time()))
    setattr(mod, attr, timed)
    # Names the CLI imported before the wrap (from ... import) are rebound where found.
    for other in list(sys.modules.values()):
        if getattr(other, "__name__", "").startswith(("hpo.", "cluster.")):
            if getattr(other, attr, None) is original:
                setattr(other, attr, timed)
marks["imported"] = time.time()
sys.argv = ["hpo", *sys.argv[4:]]
try:
    hpo.cli.main()
finally:
    marks["main returned"] = time.time()
"""


def _run(args: list[str], env: dict[str, str]) -> float:
    started = time.time()
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return time.time() - started


def ray_alone() -> float:
    return _run([PYTHON, "-c", RAY_ALONE], dict(os.environ))


def one_trial_sweep(tmp: Path, index: int) -> dict[str, Any]:
    name = f"fixed-{index}"
    spec = tmp / f"{name}.toml"
    spec.write_text(SPEC.format(name=name, storage=tmp / "results", db=tmp / f"{name}.db"))
    out = tmp / f"{name}.json"
    started = time.time()
    args = [PYTHON, "-c", WRAPPER, str(started), str(out), json.dumps(STEPS), "sweep", str(spec)]
    wall = _run(args, dict(os.environ))
    ended = started + wall
    timing = json.loads(out.read_text())
    marks, spans = timing["marks"], timing["spans"]
    phases = {
        "python start + imports": marks["imported"] - started,
    }
    for label, start, end in spans:
        phases[label] = phases.get(label, 0.0) + (end - start)
    for handler, seconds in timing["exits"]:
        phases[f"exit: {handler}"] = phases.get(f"exit: {handler}", 0.0) + seconds
    phases["exit: before the handlers (threads)"] = (
        marks["first exit handler"] - marks["main returned"]
    )
    phases["exit: between the handlers"] = (
        marks["exit handlers done"]
        - marks["first exit handler"]
        - sum(t for _, t in timing["exits"])
    )
    # hpo's last exit handler (hpo.cli._app._exit_now) stops Ray and ends the process
    phases["exit: Ray stopped, process ended"] = ended - marks["exit handlers done"]
    phases["other (between the steps)"] = wall - sum(phases.values())
    return {"wall": wall, "phases": phases}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ray_times: list[float] = []
    sweeps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sweep-fixed-cost-") as tmp:
        for index in range(args.rounds):
            ray_times.append(ray_alone())
            sweeps.append(one_trial_sweep(Path(tmp), index))
            print(
                f"round {index + 1}: Ray start+stop {ray_times[-1]:.2f} s, one-trial sweep "
                f"{sweeps[-1]['wall']:.2f} s",
                flush=True,
            )
    ray_median = statistics.median(ray_times)
    sweep_median = statistics.median(s["wall"] for s in sweeps)
    print(f"\nmedian of {args.rounds} rounds, alternated:")
    print(f"  Ray start + stop     {ray_median:6.2f} s")
    print(f"  one-trial hpo sweep  {sweep_median:6.2f} s   ({sweep_median / ray_median:.2f}x Ray)")
    print("\nwhere the sweep's time goes (median per step):")
    labels = list(sweeps[0]["phases"])
    breakdown = {
        label: statistics.median(s["phases"].get(label, 0.0) for s in sweeps) for label in labels
    }
    for label, seconds in breakdown.items():
        print(f"  {label:<30} {seconds:6.2f} s")
    return {
        "ray_s": ray_median,
        "sweep_s": sweep_median,
        "ratio": sweep_median / ray_median,
        "breakdown": breakdown,
    }


if __name__ == "__main__":
    main()
