"""Per-trial cost as a sweep grows: sweeps of tiny trials at several sizes, trials per
second over each fifth of each sweep, and the driver's peak memory, measured in one run.

    .venv/bin/python bench/sweep_scale.py                     # 200, 1000 and 5000 trials
    .venv/bin/python bench/sweep_scale.py --sizes 200 1000    # the issue's two targets
    .venv/bin/python bench/sweep_scale.py --smoke             # 12 trials, for the tests

Each size is one `hpo sweep` in a fresh process, as a user runs it: a compare sweep of
kan and liquid in f32 and bf16 (the workload that showed the growth), one fold, one epoch
of two steps at the smallest shapes, two trials at a time, on the embedded local Ray with
a new MLflow SQLite store. A trial's own work is constant, so what grows with the number
of trials is the sweep's bookkeeping. The parent reads the sweep's progress lines as they
come (one per finished trial) and samples the driver's resident memory (RSS) every 0.2 s.

Printed per size: the time to the first finished trial (the sweep's start-up), trials
per second over each fifth of the trials after it (in the order they finished), the last
fifth's time over the first's, the driver's peak RSS, and that peak over the smallest
size's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
HPO = [sys.executable, "-m", "hpo.cli"]

SPEC = """\
name = "{name}"
families = ["kan", "liquid"]
precisions = ["f32", "bf16"]
samples = {samples}
search = "random"
compare = true
max_epochs = 1
max_concurrent = 2
storage = "{storage}"
tracking_uri = "sqlite:///{db}"

[data]
n_assets = 2
n_bars = 300

[walk_forward]
n_folds = 1

[trainer]
lookback = 8
batch_size = 16
max_steps_per_epoch = 2

[search_space.kan]
window = 2
width = 4
n_layers = 1
grid_size = 3

[search_space.liquid]
hidden = 8
backbone_units = 8
backbone_layers = 1
"""


def _rss_tree(pid: int) -> int:
    """Resident memory of the driver process (its Ray processes are counted apart: the
    driver is what keeps results)."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def run_size(n_trials: int, tmp: Path) -> dict[str, Any]:
    """One sweep of ``n_trials`` trials (a multiple of 4: 2 families x 2 precisions)."""
    samples = max(1, n_trials // 4)
    name = f"scale-{n_trials}"
    spec = tmp / f"{name}.toml"
    spec.write_text(
        SPEC.format(name=name, samples=samples, storage=tmp / "results", db=tmp / f"{name}.db")
    )
    started = time.time()
    proc = subprocess.Popen(
        [*HPO, "sweep", str(spec)],
        cwd=tmp,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_tree(proc.pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    finished: list[float] = []
    tail: list[str] = []
    assert proc.stdout is not None
    at_last_trial = 0
    for line in proc.stdout:
        if line.startswith("trial ") and "val Sharpe" in line:
            finished.append(time.time())
            at_last_trial = max(at_last_trial, peak[0])
        tail = [*tail[-40:], line]
    proc.wait()
    done.set()
    sampler.join()
    if proc.returncode != 0 or len(finished) < samples * 4:
        raise RuntimeError(f"sweep of {n_trials} failed ({proc.returncode}):\n{''.join(tail)}")
    wall = time.time() - started
    n = len(finished)
    # Fifths of the trials after the first: the first one's time is the sweep's start-up
    # (Ray, MLflow, the first worker), the same at every size.
    edges = [round(i * (n - 1) / 5) for i in range(6)]
    fifths = [
        {"trials": edges[i + 1] - edges[i], "seconds": finished[edges[i + 1]] - finished[edges[i]]}
        for i in range(5)
    ]
    return {
        "trials": n,
        "wall_s": wall,
        "first_trial_s": finished[0] - started,
        "fifths": fifths,
        "peak_rss": peak[0],
        "trials_peak_rss": at_last_trial,  # while trials ran (the rest: the summary after)
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000, 5000])
    parser.add_argument("--smoke", action="store_true", help="one sweep of 12 trials")
    args = parser.parse_args(argv)
    sizes = [12] if args.smoke else args.sizes
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-scale-") as tmp:
        for size in sizes:
            row = run_size(size, Path(tmp))
            rows.append(row)
            rates = "  ".join(f"{f['trials'] / f['seconds']:5.2f}" for f in row["fifths"])
            growth = row["fifths"][-1]["seconds"] / row["fifths"][0]["seconds"]
            memory = row["peak_rss"] / rows[0]["peak_rss"]
            print(
                f"{row['trials']:>5} trials in {row['wall_s']:7.1f} s (first after "
                f"{row['first_trial_s']:4.1f} s) | trials/s per fifth "
                f"{rates} | last/first fifth {growth:4.2f}x | driver peak "
                f"{row['peak_rss'] / 2**20:6.0f} MiB ({memory:4.2f}x the first size; "
                f"{row['trials_peak_rss'] / 2**20:.0f} MiB while trials ran)",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
