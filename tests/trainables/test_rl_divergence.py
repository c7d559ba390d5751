"""A reinforcement-learning model whose action scores are NaN is a diverged trial: the
greedy argmax must not turn NaN Q-values or logits into a valid-looking strategy."""

from __future__ import annotations

import pytest
import torch

from models.base import greedy_position
from tests.trainables.helpers import tiny_config
from trainables.fold_run import TrialDiverged
from trainables.trainer import Trainer


def test_a_non_finite_score_row_gives_a_nan_position_and_the_others_their_argmax() -> None:
    scores = torch.tensor([[0.1, 0.5, 0.2], [float("nan"), 0.0, 1.0], [2.0, 1.0, float("inf")]])
    got = greedy_position(scores)
    assert got[0].item() == 0.0  # action 1 of 3: flat
    assert torch.isnan(got[1]) and torch.isnan(got[2])


@pytest.mark.parametrize("family", ["dqn", "ppo"])
def test_an_rl_model_with_nan_weights_makes_its_trial_diverged(family: str) -> None:
    trainer = Trainer(tiny_config(family, n_folds=1))
    run = trainer.folds[0]
    with torch.no_grad():
        for p in run.model.parameters():
            p.fill_(float("nan"))
    with pytest.raises(TrialDiverged, match="non-finite positions in fold 0 val"):
        trainer.evaluate(run, run.data.val)
