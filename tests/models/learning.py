"""Per-family learning budgets for the contract suite's "learns the planted signal" check.

Each entry is the smallest budget (tiny model, a few epochs on 4 synthetic assets with
signal 0.15) at which the family learned reliably, with thresholds set below what was
measured (numbers in the comments: mean over the seeds, f32 / bf16). For scale, trading
the sign of the last standardized return scores a validation Sharpe of ~2-3 here. An
untrained model's Sharpe is a coin flip (a random read of momentum features scores up to
+-4), so learning is judged on the mean over seeds against the untrained mean.
"""

from __future__ import annotations

from trainables.config import DataConfig
from trainables.contract import LearningCheck

FORECAST = {
    "epochs": 3,
    "max_steps_per_epoch": 40,
    "lr": 3e-3,
    "data": DataConfig(n_bars=1000, n_assets=4),
}


LEARNING: dict[str, LearningCheck] = {
    # measured: untrained -2.7 -> trained 4.7 / 3.4 (seed 0); 6 seeds 3.3-4.7
    "dqn": LearningCheck(
        {
            "epochs": 2,
            "rl_iterations": 100,
            "data": DataConfig(n_bars=1500, n_assets=4),
            "model_config": {},
        },
        seeds=(0,),
        min_mean=2.0,
        min_gain=1.0,
        min_each=2.0,
    ),
    # measured: untrained -0.3 -> 3.17 / 3.04
    "ppo": LearningCheck(
        {
            "epochs": 3,
            "rl_iterations": 5,
            "lr": 3e-3,
            "data": DataConfig(n_bars=1000, n_assets=4),
            "model_config": {
                "num_envs": 64,
                "n_steps": 8,
                "minibatches": 2,
                "ppo_epochs": 2,
                "gamma": 0.5,
            },
        }
    ),
    # measured: untrained 0.3 -> 3.4 / 3.4
    "tft": LearningCheck(
        {**FORECAST, "model_config": {"d_model": 8, "n_heads": 1, "dropout": 0.0}},
        min_mean=2.5,
        min_each=2.0,
    ),
    # measured: untrained 0.16 -> 3.11 / 3.12 (3 seeds)
    "mamba2": LearningCheck(
        {**FORECAST, "model_config": {"d_model": 16, "n_layers": 1, "d_state": 8, "head_dim": 8}},
        seeds=(0, 1, 2),
        min_mean=2.5,
        min_each=2.0,
    ),
    "tggn": LearningCheck(
        {
            **FORECAST,
            "model_config": {
                "channels": 8,
                "skip_channels": 16,
                "end_channels": 16,
                "node_dim": 4,
                "n_layers": 1,
                "dropout": 0.0,
            },
        },
        min_mean=2.2,
        min_gain=2.5,
        min_each=1.5,
    ),
    # measured (seeds 0-3): untrained -0.9 -3.7 -2.2 2.2 -> f32 4.52 2.24 1.46 2.28 (mean
    # 2.62) / bf16 4.89 1.69 -1.50 2.53 (mean 1.90). bf16 seed 2 does not learn at this
    # budget (8 seeds: bf16 min -1.50, f32 min 1.46), and none of the budgets tried (4-5
    # epochs, lr 1e-3, width 32, position_scale 1) kept every seed above 0 in both
    # precisions, so the floor sits 1.0 below the weakest seed.
    "tlob": LearningCheck(
        {**FORECAST, "model_config": {"hidden_dim": 16, "n_layers": 1}},
        min_mean=1.5,
        min_each=-2.5,
    ),
    # measured: untrained -2.63 -> 2.85 / 2.85
    "liquid": LearningCheck(
        {**FORECAST, "model_config": {"hidden": 8, "backbone_units": 16}}, min_each=0.5
    ),
    # measured: untrained 0.16 -> 2.76 / 2.75
    "kan": LearningCheck({**FORECAST, "model_config": {}}, min_gain=1.8),
    # measured: untrained -1.7 -> 2.79 / 3.08 (3 seeds)
    "xlstm": LearningCheck(
        {**FORECAST, "model_config": {"d_model": 16, "blocks": "ms", "n_heads": 2, "dropout": 0.1}},
        seeds=(0, 1, 2),
        min_gain=2.5,
    ),
    # measured: untrained exactly 0 (zero-initialised head) -> 2.87 / 2.87
    "diffusion": LearningCheck(
        {**FORECAST, "model_config": {"hidden": 16, "n_samples": 8, "sampling_steps": 5}},
        min_mean=2.2,
        min_gain=2.2,
        min_each=1.5,
    ),
}
