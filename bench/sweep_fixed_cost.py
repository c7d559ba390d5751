"""The fixed cost of a sweep: a one-trial `hpo sweep` beside Ray's own start and stop,
measured side by side in one run, with where the sweep's time goes.

    .venv/bin/python bench/sweep_fixed_cost.py             # 5 rounds (~2 min)
    .venv/bin/python bench/sweep_fixed_cost.py --rounds 1  # a quick look
    git worktree add /tmp/before HEAD~1
    .venv/bin/python bench/sweep_fixed_cost.py --compare-with /tmp/before  # side by side

Each round runs, one after the other in fresh processes:

* Ray alone: ``python -c "import ray; ray.init(...); ray.shutdown()"`` with the arguments
  the embedded sweep gives it (2 CPUs, no dashboard, loopback);
* a one-trial sweep: ``hpo sweep`` of one tiny tft trial (one fold, one epoch of 3 steps,
  f32) on the embedded local Ray with a new MLflow SQLite store, as ``make demo`` runs.

The sweep runs under a wrapper that times the steps of ``hpo sweep`` (wrapping the
functions the CLI calls as the program imports their modules, no change to the product or
to when it imports what), so the breakdown and the total come from the same run; it also
notes when torch, MLflow and Ray Tune had been imported. With ``--compare-with`` each
round also runs the sweep of another checkout, in turn with this one's. The rounds alternate the two sides, and medians are printed, because
this machine's wall times drift between runs.
"""

from __future__ import annotations

import argparse
import itertools
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
import importlib, importlib.abc, json, sys, time, atexit
t0 = float(sys.argv[1]); out = sys.argv[2]; steps = json.loads(sys.argv[3])
marks = {"python started": time.time()}
spans = []
exits = []
_register, _unregister = atexit.register, atexit.unregister
timed_handlers = {}
def register(func, *a, **k):  # time each exit handler (Ray's shutdown, MLflow's, ...)
    def timed_exit(*aa, **kk):
        start = time.time()
        marks.setdefault("first exit handler", start)
        try:
            return func(*aa, **kk)
        finally:
            exits.append((getattr(func, "__qualname__", repr(func)), time.time() - start))
    timed_handlers[func] = timed_exit
    _register(timed_exit, *a, **k)
    return func
def unregister(func):  # hpo's main unregisters Ray's own exit handler
    _unregister(timed_handlers.pop(func, func))
atexit.register, atexit.unregister = register, unregister
def dump():
    marks["exit handlers done"] = time.time()
    with open(out, "w") as f:
        json.dump({"t0": t0, "marks": marks, "spans": spans, "exits": exits}, f)
_register(dump)  # registered first: runs last, after the handlers it times

def wrap(mod, attr, label):
    owner = mod
    if "." in attr:  # a method: Class.name
        cls_name, attr = attr.split(".")
        owner = getattr(mod, cls_name)
    original = getattr(owner, attr, None)
    if original is None:  # a step this version of hpo does not have
        return
    def timed(*a, __f=original, __label=label, **k):
        start = time.time()
        try:
            return __f(*a, **k)
        finally:
            spans.append((__label, start, time.time()))
    setattr(owner, attr, timed)
    # Names imported before the wrap (from ... import) are rebound where found.
    for other in list(sys.modules.values()):
        if getattr(other, "__name__", "").startswith(("hpo.", "cluster.")):
            if getattr(other, attr, None) is original:
                setattr(other, attr, timed)

# Modules are wrapped as the program imports them, not before: what `hpo sweep` imports,
# and when, is the product's (a local Ray starts before the driver imports MLflow and Tune).
pending = {}
for module, attr, label in steps:
    pending.setdefault(module, []).append((attr, label))
IMPORTED = {"torch": "torch imported", "mlflow": "mlflow imported", "ray.tune": "ray.tune imported"}
class WrapOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in pending and name not in IMPORTED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module
        def exec_then_wrap(module, __exec=exec_module, __name=name):
            __exec(module)
            if __name in IMPORTED:
                marks[IMPORTED[__name]] = time.time()
            for attr, label in pending.pop(__name, ()):
                wrap(module, attr, label)
        spec.loader.exec_module = exec_then_wrap
        return spec
sys.meta_path.insert(0, WrapOnImport())
import hpo.cli
from hpo.cli import _app
if hasattr(_app, "_exit_now"):  # the program ends in its last handler: dump first
    _exit_now = _app._exit_now
    def dump_then_exit(status):
        dump()
        _exit_now(status)
    _app._exit_now = dump_then_exit
for module in list(pending):  # those the CLI imported already
    if module in sys.modules:
        for attr, label in pending.pop(module):
            wrap(sys.modules[module], attr, label)
marks["imported"] = time.time()
sys.argv = ["hpo", *sys.argv[4:]]
try:
    hpo.cli.main()
finally:
    marks["main returned"] = time.time()
"""


def _run(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> float:
    started = time.time()
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return time.time() - started


def ray_alone() -> float:
    return _run([PYTHON, "-c", RAY_ALONE], dict(os.environ))


# When each large package had been imported, in seconds from the sweep's start.
IMPORT_MARKS = ("torch imported", "mlflow imported", "ray.tune imported")


def one_trial_sweep(tmp: Path, index: int, root: Path = ROOT) -> dict[str, Any]:
    """A one-trial ``hpo sweep`` of the checkout at ``root`` (its code, this Python)."""
    name = f"fixed-{index}"
    spec = tmp / f"{name}.toml"
    spec.write_text(SPEC.format(name=name, storage=tmp / "results", db=tmp / f"{name}.db"))
    out = tmp / f"{name}.json"
    started = time.time()
    args = [PYTHON, "-c", WRAPPER, str(started), str(out), json.dumps(STEPS), "sweep", str(spec)]
    env = {**os.environ, "PYTHONPATH": str(root)}  # the driver's and Ray workers' code
    wall = _run(args, env, cwd=root)
    ended = started + wall
    timing = json.loads(out.read_text())
    marks, spans = timing["marks"], timing["spans"]
    phases = {
        "python start + hpo.cli": marks["imported"] - started,
    }
    for label, start, end in spans:
        phases[label] = phases.get(label, 0.0) + (end - start)
    for handler, seconds in timing["exits"]:
        phases[f"exit: {handler}"] = phases.get(f"exit: {handler}", 0.0) + seconds
    first_exit = marks.get("first exit handler", marks["exit handlers done"])
    phases["exit: before the handlers (threads)"] = first_exit - marks["main returned"]
    phases["exit: between the handlers"] = (
        marks["exit handlers done"] - first_exit - sum(t for _, t in timing["exits"])
    )
    # hpo's last exit handler (hpo.cli._app._exit_now) stops Ray and ends the process
    phases["exit: Ray stopped, process ended"] = ended - marks["exit handlers done"]
    phases["other (between the steps)"] = wall - sum(phases.values())
    imported = {m: marks[m] - started for m in IMPORT_MARKS if m in marks}
    return {"wall": wall, "phases": phases, "imported": imported}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="another checkout of this project (a worktree of an earlier commit): each round "
        "also runs its one-trial sweep, in turn with this one's (alternating which goes first)",
    )
    args = parser.parse_args(argv)
    sides = {"this": ROOT}
    if args.compare_with is not None:
        sides = {"before": args.compare_with.resolve(), "this": ROOT}
    count = itertools.count()
    ray_times: list[float] = []
    sweeps: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="sweep-fixed-cost-") as tmp:
        for index in range(args.rounds):
            ray_times.append(ray_alone())
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            for side in order:
                sweeps[side].append(one_trial_sweep(Path(tmp), next(count), sides[side]))
            walls = ", ".join(f"{side} {sweeps[side][-1]['wall']:.2f} s" for side in sides)
            print(
                f"round {index + 1}: Ray start+stop {ray_times[-1]:.2f} s, one-trial sweep: "
                f"{walls}",
                flush=True,
            )
    ray_median = _median(ray_times)
    print(f"\nmedian of {args.rounds} rounds, alternated:")
    print(f"  Ray start + stop     {ray_median:6.2f} s")
    result: dict[str, Any] = {"ray_s": ray_median}
    for side, runs in sweeps.items():
        sweep_median = _median([s["wall"] for s in runs])
        label = "one-trial hpo sweep" if len(sides) == 1 else f"sweep ({side})"
        print(f"  {label:<20} {sweep_median:6.2f} s   ({sweep_median / ray_median:.2f}x Ray)")
        result[side] = {"sweep_s": sweep_median, "ratio": sweep_median / ray_median}
    for side, runs in sweeps.items():
        print(f"\nwhere the sweep's time goes ({side}; median per step):")
        labels = list(dict.fromkeys(label for s in runs for label in s["phases"]))
        breakdown = {
            label: _median([s["phases"][label] for s in runs if label in s["phases"]])
            for label in labels
        }
        for label, seconds in breakdown.items():
            print(f"  {label:<34} {seconds:6.2f} s")
        for mark in IMPORT_MARKS:
            at = [s["imported"][mark] for s in runs if mark in s["imported"]]
            if at:
                print(f"  at {_median(at):5.2f} s from the start: {mark}")
        result[side]["breakdown"] = breakdown
    if len(sides) == 1:  # the keys this script returned before --compare-with
        result.update(sweep_s=result["this"]["sweep_s"], ratio=result["this"]["ratio"])
        result["breakdown"] = result["this"]["breakdown"]
    return result


if __name__ == "__main__":
    main()
