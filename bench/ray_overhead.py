"""Wall time of the same 16 short trials through hpo's Ray Tune path and through an
in-process Optuna loop at the same concurrency; prints both and their ratios.

    .venv/bin/python bench/ray_overhead.py            # 16 trials, concurrency 2 (~1 min)
    .venv/bin/python bench/ray_overhead.py --smoke    # 4 trials, for a quick look

Both sides train identical TrainConfigs (TFT, f32, tiny shapes, 3 epochs, random search
over the same space with the same seed). The Ray path runs twice:

* cold: what a first `hpo sweep` on a fresh machine waits for: Ray's start-up, a new
  MLflow SQLite store, actor start-up, per-epoch checkpoints and MLflow logging;
* warm: the same sweep again on the Ray instance and MLflow store that are now running,
  which is what each sweep submitted to a standing cluster pays.

Their difference is the fixed start-up cost. The warm run still starts its trial actors:
Tune creates them per ``Tuner.fit`` and Ray places a new actor only on a worker process
that has never run anything, so each sweep pays fresh processes importing torch, Ray Tune
and the trainer. That start-up is measured on its own (the same number of actors, each
importing the trial module, on the running Ray) and printed beside the warm ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
import torch

from hpo.search.optuna_searcher import to_optuna
from hpo.search.space import trial_space
from hpo.spec import parse_spec
from trainables.config import DataConfig, build_train_config
from trainables.trainer import Trainer

TRAINER = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 20, "n_folds": 1}
DATA: dict[str, Any] = {"n_assets": 2, "n_bars": 600}
OVERRIDES = {"d_model": 8, "n_heads": 1, "lstm_layers": 1}


def spec_payload(n_trials: int, concurrency: int, tmp: Path) -> dict:
    return {
        "name": "ray-overhead",
        "families": ["tft"],
        "precisions": ["f32"],
        "samples": n_trials,
        "search": "random",
        "scheduler": "fifo",
        "max_epochs": 3,
        "max_concurrent": concurrency,
        "storage": str(tmp / "results"),
        "tracking_uri": f"sqlite:///{tmp / 'mlflow.db'}",
        "data": DATA,
        "walk_forward": {"n_folds": 1},
        "trainer": {k: v for k, v in TRAINER.items() if k != "n_folds"},
        "search_space": {"tft": OVERRIDES},
    }


def run_optuna(n_trials: int, concurrency: int) -> float:
    space = trial_space("tft", OVERRIDES)
    distributions = {k: to_optuna(d) for k, d in space.dims.items()}

    def objective(trial: optuna.Trial) -> float:
        torch.set_num_threads(1)
        params = {k: trial._suggest(k, d) for k, d in distributions.items()}
        config = build_train_config(
            "tft",
            {**space.fixed, **params},
            data=DataConfig(**DATA),
            epochs=3,
            device="cpu",
            **TRAINER,
        )
        return float(Trainer(config).fit()[-1]["val_sharpe"])

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    start = time.perf_counter()
    study.optimize(objective, n_trials=n_trials, n_jobs=concurrency)
    return time.perf_counter() - start


def run_ray(n_trials: int, concurrency: int, workdir: Path, name: str) -> float:
    from hpo.sweep import run_sweep

    payload = {**spec_payload(n_trials, concurrency, workdir), "name": name}
    spec = parse_spec(payload)
    start = time.perf_counter()
    run_sweep(spec, num_cpus=concurrency, on_event=lambda line: None)
    return time.perf_counter() - start


def actor_start_s(concurrency: int) -> float:
    """Wall time for ``concurrency`` fresh Ray actors to import the trial module, as Tune's
    trial actors do before their first trial (the running Ray has no unused worker)."""
    import ray

    @ray.remote(num_cpus=1)
    class TrialModuleImporter:
        def __init__(self) -> None:
            import trainables.trial  # noqa: F401  (what a trial actor loads)

        def ready(self) -> bool:
            return True

    start = time.perf_counter()
    actors = [TrialModuleImporter.remote() for _ in range(concurrency)]  # type: ignore[attr-defined]
    ray.get([actor.ready.remote() for actor in actors])
    elapsed = time.perf_counter() - start
    for actor in actors:
        ray.kill(actor)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="4 trials")
    args = parser.parse_args()
    n = 4 if args.smoke else args.trials
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    in_process = run_optuna(n, args.concurrency)
    with tempfile.TemporaryDirectory() as tmp:
        cold = run_ray(n, args.concurrency, Path(tmp), "ray-overhead-cold")
        actors = actor_start_s(args.concurrency)
        warm = run_ray(n, args.concurrency, Path(tmp), "ray-overhead-warm")
    print(f"{n} trials, concurrency {args.concurrency}")
    print(f"in-process Optuna loop                : {in_process:7.1f} s")
    print(f"hpo Ray path, cold (Ray + store start): {cold:7.1f} s   {cold / in_process:.2f}x")
    print(f"hpo Ray path, warm (running Ray/store): {warm:7.1f} s   {warm / in_process:.2f}x")
    print(f"  trial actors' start-up, alone       : {actors:7.1f} s")
    rest = warm - actors  # an estimate: inside the sweep the start-up overlaps driver work
    print(f"  warm minus that start-up (estimate) : {rest:7.1f} s   {rest / in_process:.2f}x")
    print(f"fixed start-up cost (cold - warm)     : {cold - warm:7.1f} s")


if __name__ == "__main__":
    main()
