"""PPO family: GAE against a reference loop, hand-computed clipped objectives, f32
log-probabilities under bf16, the RLLearner cycle without host reads, stored-state LSTM
replay, deterministic greedy evaluation, exact resume, and learning the planted signal
through the trainer."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from models.nets.ppo import PPOLearner, build, clipped_surrogate, gae, value_loss
from models.ppo import PPOConfig
from tests.models.rl_loop import SHAPE, tiny_env, tiny_learner, train_learner
from tests.trainables.helpers import tiny_config
from trainables.checkpoint import load_checkpoint
from trainables.env import TradingEnv, greedy_positions
from trainables.precision import floating_dtypes, get_policy
from trainables.trainer import Trainer

# episode_len 5 against bptt 4: episodes start inside training sequences.
SMALL = PPOConfig(
    hidden=8, num_envs=4, n_steps=8, bptt=4, minibatches=2, ppo_epochs=2, episode_len=5
)


# --------------------------------------------------------------------------------------
# defaults


def test_defaults() -> None:
    cfg = PPOConfig()
    assert (cfg.gamma, cfg.gae_lambda, cfg.clip_coef, cfg.ent_coef) == (0.9, 0.95, 0.2, 0.01)
    assert (cfg.num_envs, cfg.n_steps, cfg.minibatches, cfg.ppo_epochs) == (32, 16, 4, 4)


# --------------------------------------------------------------------------------------
# the objective


def _reference_gae(
    rewards: list[list[float]],
    values: list[list[float]],
    dones: list[list[bool]],
    last_value: list[float],
    gamma: float,
    lam: float,
    final_values: list[list[float]] | None,
) -> list[list[float]]:
    """Schulman et al. 2016, eq. 16, one environment and one step at a time."""
    steps, envs = len(rewards), len(rewards[0])
    adv = [[0.0] * envs for _ in range(steps)]
    for n in range(envs):
        running = 0.0
        for t in reversed(range(steps)):
            if dones[t][n]:
                next_value = 0.0 if final_values is None else final_values[t][n]
                running = 0.0  # the next step belongs to another episode
            else:
                next_value = values[t + 1][n] if t + 1 < steps else last_value[n]
            delta = rewards[t][n] + gamma * next_value - values[t][n]
            running = delta + gamma * lam * running
            adv[t][n] = running
    return adv


@pytest.mark.parametrize("truncation", [False, True])
def test_gae_matches_the_reference_loop(truncation: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    steps, envs, gamma, lam = 12, 3, 0.9, 0.8
    rewards = torch.randn(steps, envs, generator=gen)
    values = torch.randn(steps, envs, generator=gen)
    dones = torch.rand(steps, envs, generator=gen) < 0.25
    dones[-1, 0] = True  # an end on the rollout's last step: last_value must not leak in
    last_value = torch.randn(envs, generator=gen)
    finals = torch.randn(steps, envs, generator=gen) if truncation else None
    adv, returns = gae(rewards, values, dones, last_value, gamma, lam, finals)
    expected = _reference_gae(
        rewards.tolist(),
        values.tolist(),
        dones.tolist(),
        last_value.tolist(),
        gamma,
        lam,
        None if finals is None else finals.tolist(),
    )
    assert dones.any() and adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, adv + values)


def test_gae_hand_computed_with_an_episode_end() -> None:
    # One env, three steps, gamma 0.5, lambda 0.5; the episode ends after step 1 (terminal).
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [2.0]])
    dones = torch.tensor([[False], [True], [False]])
    adv, _ = gae(rewards, values, dones, torch.tensor([4.0]), 0.5, 0.5)
    # delta_2 = 3 + 0.5 * 4 - 2 = 3;  A_2 = 3
    # delta_1 = 2 + 0 - 1 = 1;        A_1 = 1 (no carry across the end)
    # delta_0 = 1 + 0.5 * 1 - 0.5 = 1; A_0 = 1 + 0.25 * 1 = 1.25
    torch.testing.assert_close(adv, torch.tensor([[1.25], [1.0], [3.0]]))
    # A time limit instead: the end bootstraps from V(final) = 6 -> delta_1 = 2 + 3 - 1 = 4
    adv, _ = gae(rewards, values, dones, torch.tensor([4.0]), 0.5, 0.5, torch.full((3, 1), 6.0))
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.25 * 4.0], [4.0], [3.0]]))


def test_clipped_surrogate_hand_computed() -> None:
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])
    old = torch.tensor([-1.0, -0.5, -2.0, -0.3])
    new = old + ratios.log()
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0])
    # min(r A, clip(r, 0.8, 1.2) A): [min(1.5, 1.2), min(0.5, 0.8), min(-2.2, -2.2),
    # min(-0.7, -0.8)] = [1.2, 0.5, -2.2, -0.8]; mean -0.325, negated for minimizing
    loss = clipped_surrogate(new, old, adv, clip_coef=0.2)
    torch.testing.assert_close(loss, torch.tensor(0.325))
    assert loss.dtype == torch.float32
    # the same from bf16 inputs is still computed in f32
    assert clipped_surrogate(new.bfloat16(), old, adv, 0.2).dtype == torch.float32


def test_value_loss_hand_computed() -> None:
    value, old, returns = (
        torch.tensor([1.5, 0.0]),
        torch.tensor([1.0, 0.0]),
        torch.tensor([2.0, 0.5]),
    )
    # row 0: (1.5 - 2)^2 = 0.25, clipped to 1.2: (1.2 - 2)^2 = 0.64 -> max 0.64; row 1: 0.25
    torch.testing.assert_close(
        value_loss(value, old, returns, 0.2), torch.tensor(0.5 * (0.64 + 0.25) / 2)
    )
    torch.testing.assert_close(
        value_loss(value, old, returns, 0.0), torch.tensor(0.5 * (0.25 + 0.25) / 2)
    )


def test_loss_wires_the_pieces_together() -> None:
    # Zero weights: every state gets logits = policy bias and value = value bias.
    config = dataclasses.replace(SMALL, recurrent=False)
    learner = tiny_learner(build, config)
    learner.collect(tiny_env(config), 0.0)
    ro = learner.rollout
    assert ro is not None
    with torch.no_grad():
        for p in learner.net.parameters():
            p.zero_()
        learner.net.policy.bias.copy_(torch.tensor([0.5, 0.25, 0.25]).log())
        learner.net.value.bias.fill_(0.3)
    batch = torch.arange(config.num_envs * config.n_steps)
    t, e = batch // config.num_envs, batch % config.num_envs
    logp = torch.tensor([0.5, 0.25, 0.25]).log()
    new_logp = logp[ro.action[t, e]]
    adv = ro.advantage[t, e]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    expected = (
        clipped_surrogate(new_logp, ro.logprob[t, e], adv, config.clip_coef)
        + config.vf_coef
        * value_loss(torch.full_like(adv, 0.3), ro.value[t, e], ro.returns[t, e], config.value_clip)
        - config.ent_coef * (-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    )
    torch.testing.assert_close(learner.loss(batch), expected)


# --------------------------------------------------------------------------------------
# precision


@pytest.mark.parametrize("recurrent", [False, True])
def test_log_probs_and_returns_are_f32_under_bf16(
    recurrent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(SMALL, recurrent=recurrent)
    learner = tiny_learner(build, config, "bf16")
    assert set(floating_dtypes(learner).values()) == {torch.bfloat16}
    seen: list[torch.dtype] = []
    log_softmax = torch.nn.functional.log_softmax

    def spy(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(x.dtype)
        return log_softmax(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.nn.functional, "log_softmax", spy)
    learner.collect(tiny_env(config, "bf16"), 0.0)
    ro = learner.rollout
    assert ro is not None
    assert ro.window.dtype == ro.position.dtype == torch.bfloat16
    for name in ("logprob", "value", "reward", "final_value", "advantage", "returns"):
        assert getattr(ro, name).dtype == torch.float32, name
    if recurrent:
        assert ro.h is not None and ro.h.dtype == torch.bfloat16
    losses = list(learner.losses())
    assert seen and set(seen) == {torch.float32}  # every log-softmax ran on f32 logits
    assert all(loss.dtype == torch.float32 for loss in losses)
    _, _, logp_all, value = learner.evaluate(torch.arange(4))
    assert logp_all.dtype == torch.float32 and value.dtype == torch.bfloat16
    assert all(v.dtype == torch.float32 for v in learner.stats.values())


# --------------------------------------------------------------------------------------
# the RLLearner cycle


def _train(
    learner: PPOLearner,
    env: TradingEnv,
    policy_name: str,
    collects: int,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> list[torch.Tensor]:
    return train_learner(learner, env, policy_name, collects, monkeypatch, max_grad_norm=1.0)


@pytest.mark.parametrize("policy", ["f32", "bf16"])
@pytest.mark.parametrize("recurrent", [False, True])
def test_collect_and_losses_cycle(
    policy: str, recurrent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(SMALL, recurrent=recurrent)
    learner, env = tiny_learner(build, config, policy), tiny_env(config, policy)
    before = [p.detach().clone() for p in learner.trainable_parameters()]
    losses = _train(learner, env, policy, collects=3, monkeypatch=monkeypatch)
    assert len(losses) == 3 * config.ppo_epochs * config.minibatches == 12
    stacked = torch.stack(losses)
    assert stacked.dtype == torch.float32 and torch.isfinite(stacked).all()
    assert learner.env_steps == 3 * config.n_steps and learner.grad_steps == 12
    assert list(learner.losses()) == []  # a rollout is trained on once
    assert any(
        not torch.equal(a, b) for a, b in zip(before, learner.trainable_parameters(), strict=True)
    )
    assert learner.rollout is not None and learner.rollout.done.any()  # episodes of 5 ended
    assert torch.isfinite(learner.rollout.final_value).all()
    positions = learner.positions(env.observe())
    assert set(positions.tolist()) <= {-1.0, 0.0, 1.0}


@pytest.mark.parametrize("recurrent", [False, True])
def test_replay_of_the_rollout_reproduces_collection(recurrent: bool) -> None:
    # Before any update, re-running the networks on the stored rollout (the LSTM from its
    # stored states, reset at the episode starts inside each sequence) gives back exactly
    # the log-probabilities and values seen while collecting.
    config = dataclasses.replace(SMALL, recurrent=recurrent)
    learner, env = tiny_learner(build, config), tiny_env(config)
    learner.collect(env, 0.0)
    learner.collect(env, 0.0)  # the second rollout starts from a carried, nonzero state
    ro = learner.rollout
    assert ro is not None and ro.start[1:].any()
    items = config.num_envs * config.n_steps // (config.bptt if recurrent else 1)
    t, e, logp_all, value = learner.evaluate(torch.randperm(items))
    assert t.shape == ((config.bptt, items) if recurrent else (1, items))
    logp = logp_all.gather(1, ro.action[t, e].reshape(-1, 1)).squeeze(1)
    torch.testing.assert_close(logp, ro.logprob[t, e].flatten(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, ro.value[t, e].flatten(), rtol=1e-5, atol=1e-5)
    assert sorted(zip(t.flatten().tolist(), e.flatten().tolist(), strict=True)) == [
        (i, j) for i in range(config.n_steps) for j in range(config.num_envs)
    ]  # every transition exactly once


def test_recurrent_greedy_evaluation_is_deterministic() -> None:
    config = dataclasses.replace(SMALL, recurrent=True)
    learner = tiny_learner(build, config)
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(60, 2, SHAPE.n_features, generator=gen)

    def trade() -> torch.Tensor:
        learner.eval()  # what the trainer does before every evaluation span
        return greedy_positions(learner.positions, features, SHAPE.lookback, (10, 60))

    first = trade()
    assert learner._eval_state is not None  # the state is carried from bar to bar
    assert torch.equal(trade(), first)
    learner.act(
        (torch.randn(3, SHAPE.lookback, SHAPE.n_features), torch.zeros(3))
    )  # new batch size
    assert learner._eval_state is not None and learner._eval_state[0].shape == (3, config.hidden)
    learner.train()
    assert learner._eval_state is None


# --------------------------------------------------------------------------------------
# resume


@pytest.mark.parametrize("policy", ["f32", "bf16"])
def test_buffer_state_round_trip_resumes_exactly(policy: str) -> None:
    config = dataclasses.replace(SMALL, recurrent=True)
    learner, env = tiny_learner(build, config, policy, seed=0), tiny_env(config, policy)
    _train(learner, env, policy, collects=2)
    learner.collect(env, 0.5)  # a pending rollout: resume must train on the same data
    saved = st_load(
        st_save(
            {
                **{f"model.{k}": v.contiguous() for k, v in learner.state_dict().items()},
                **{f"buffer.{k}": v.contiguous() for k, v in learner.buffer_state().items()},
                **{f"env.{k}": v for k, v in env.state_dict().items()},
            }
        )
    )

    def section(prefix: str) -> dict[str, torch.Tensor]:
        return {k.removeprefix(prefix): v for k, v in saved.items() if k.startswith(prefix)}

    resumed, resumed_env = (
        tiny_learner(build, config, policy, seed=5),
        tiny_env(config, policy, seed=9),
    )
    resumed.load_state_dict(section("model."))
    resumed.load_buffer_state(section("buffer."))
    resumed_env.load_state_dict(section("env."))
    assert (
        resumed.rollout is not None
        and resumed.rollout.window.dtype == get_policy(policy).data_dtype
    )
    assert (resumed.env_steps, resumed.grad_steps, resumed.pending) == (3 * config.n_steps, 8, True)

    a, b = list(learner.losses()), list(resumed.losses())
    assert len(a) == len(b) == 4 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for run, run_env in ((learner, env), (resumed, resumed_env)):
        run.collect(run_env, 0.6)  # carried episode starts, LSTM states and generator
    assert learner.rollout is not None
    for name, tensor in learner.rollout.state_dict().items():
        assert torch.equal(tensor, resumed.rollout.state_dict()[name]), name


def test_trainer_resume_equals_uninterrupted(tmp_path: Path) -> None:
    model_config = {
        "hidden": 8,
        "recurrent": True,
        "num_envs": 8,
        "n_steps": 8,
        "bptt": 4,
        "minibatches": 2,
        "ppo_epochs": 1,
    }
    config = tiny_config(family="ppo", epochs=2, rl_iterations=2, model_config=model_config)
    straight = Trainer(config)
    straight.fit()
    first = Trainer(config.replace(epochs=1))
    first.fit()
    first.save(tmp_path / "epoch1")
    resumed = Trainer(config, checkpoint=load_checkpoint(tmp_path / "epoch1"))
    resumed.fit()
    for name, tensor in straight.folds[0].model.state_dict().items():
        assert torch.equal(resumed.folds[0].model.state_dict()[name], tensor), name
    assert resumed.history[-1]["train_loss"] == straight.history[-1]["train_loss"]
    assert resumed.history[-1]["val_sharpe"] == straight.history[-1]["val_sharpe"]
