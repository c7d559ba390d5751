"""DQN family: hand-computed double-DQN targets and C51 projections, dueling centring,
the RLLearner cycle under f32 and bf16 without host reads, and exact resume from
``buffer_state``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from models.dqn import DQNConfig
from models.nets.dqn import DQNLearner, WindowEncoder, build, categorical_projection
from models.replay import ReplaySample
from tests.models.rl_loop import SHAPE, tiny_env, tiny_learner, train_learner
from trainables.env import TradingEnv
from trainables.precision import floating_dtypes, get_policy

SMALL = DQNConfig(
    hidden=16,
    gamma=0.99,
    n_step=3,
    num_envs=4,
    episode_len=8,
    buffer_capacity=256,
    replay_batch_size=16,
    learning_starts=32,
    train_every=2,
    gradient_steps=2,
    target_update_period=3,
)


# --------------------------------------------------------------------------------------
# defaults


def test_defaults() -> None:
    cfg = DQNConfig()
    assert (cfg.hidden, cfg.encoder, cfg.gamma, cfg.n_step, cfg.distributional) == (
        64,
        "factorized",
        0.5,
        1,
        False,
    )
    assert cfg.target_update_period == 100


def test_epsilon_schedule_is_linear_then_flat() -> None:
    learner = build(DQNConfig(eps_start=1.0, eps_end=0.1, eps_decay=0.5), SHAPE)
    assert [learner.epsilon(p) for p in (0.0, 0.25, 0.5, 0.9)] == pytest.approx(
        [1.0, 0.55, 0.1, 0.1]
    )


# --------------------------------------------------------------------------------------
# network pieces


@pytest.mark.parametrize("distributional", [False, True])
def test_dueling_advantage_is_zero_centred(distributional: bool) -> None:
    learner = tiny_learner(build, dataclasses.replace(SMALL, distributional=distributional))
    obs = (torch.randn(5, SHAPE.lookback, SHAPE.n_features), torch.tensor([-1.0, 0, 1, 0, 1]))
    value, adv = learner.online.streams(obs)
    k = SMALL.n_atoms if distributional else 1
    assert value.shape == (5, 1, k) and adv.shape == (5, 3, k)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(5, k), atol=1e-6, rtol=0)
    out = learner.online(obs)
    torch.testing.assert_close(out, value + adv)
    torch.testing.assert_close(out.mean(dim=1, keepdim=True), value, atol=1e-6, rtol=1e-6)


def test_window_encoder_is_a_factorized_linear_layer_starting_at_the_last_bar() -> None:
    torch.manual_seed(0)
    enc = WindowEncoder(lookback=5, n_features=3, hidden=4)
    x = torch.randn(6, 5, 3)
    # At init only the decision bar counts: relu(W x_L + b).
    torch.testing.assert_close(enc(x), torch.relu(enc.bar(x[:, -1]) + enc.bias))
    with torch.no_grad():
        enc.lag.normal_()
        enc.bias.normal_()
    # Same map as one flat linear layer whose weight is lag[h, l] * W[h, f].
    weight = (enc.lag[:, :, None] * enc.bar.weight[:, None, :]).reshape(4, 15)
    torch.testing.assert_close(enc(x), torch.relu(x.reshape(6, 15) @ weight.T + enc.bias))


def _constant_net(net: torch.nn.Module, value: float, advantage: list[float]) -> None:
    """Zero every weight so the outputs are the head biases, whatever the input."""
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.value.bias.fill_(value)
        net.advantage.bias.copy_(torch.tensor(advantage))


def _batch(
    reward: list[float],
    discount: list[float],
    done: list[bool],
    action: list[int],
    weights: list[float],
) -> ReplaySample:
    b = len(reward)
    window = torch.zeros(b, SHAPE.lookback, SHAPE.n_features)
    return ReplaySample(
        obs=(window, torch.zeros(b)),
        action=torch.tensor(action),
        reward=torch.tensor(reward),
        done=torch.tensor(done),
        next_obs=(window, torch.zeros(b)),
        discount=torch.tensor(discount),
        indices=torch.arange(b),
        weights=torch.tensor(weights),
    )


def test_double_dqn_target_and_loss_hand_computed() -> None:
    learner = tiny_learner(build, dataclasses.replace(SMALL, hidden=2))
    # online: A = [1, 3, 2] - 2 -> Q = [-1, 1, 0], argmax = action 1
    _constant_net(learner.online, 0.0, [1.0, 3.0, 2.0])
    # target: A = [5, 0, 7] - 4, V = 0.5 -> Q = [1.5, -3.5, 3.5]; it values action 1 at -3.5
    _constant_net(learner.target, 0.5, [5.0, 0.0, 7.0])
    batch = _batch([1.0, 2.0], [0.81, 0.81], [False, True], [0, 1], [1.0, 0.5])
    target = learner.td_target(batch.reward, batch.bootstrap, batch.next_obs)
    # row 0: 1 + 0.81 * (-3.5) = -1.835 (plain DQN's max would give 1 + 0.81 * 3.5 = 3.835)
    # row 1: done -> the n-step return alone, 2.0
    torch.testing.assert_close(target, torch.tensor([-1.835, 2.0]))
    loss, signal = learner.loss(batch)
    # row 0: Q(s, 0) = -1, td = -0.835 -> Huber 0.5 * 0.835^2 = 0.3486125, weight 1
    # row 1: Q(s, 1) = 1, td = 1 -> Huber 0.5 (|td| <= delta), weight 0.5 -> 0.25
    torch.testing.assert_close(loss, torch.tensor((0.3486125 + 0.25) / 2))
    torch.testing.assert_close(signal, torch.tensor([0.835, 1.0]))
    assert loss.dtype == torch.float32 and not signal.requires_grad


def test_categorical_projection_hand_computed() -> None:
    support = torch.tensor([-1.0, 0.0, 1.0])
    probs = torch.tensor([[0.2, 0.5, 0.3]] * 3)
    reward = torch.tensor([0.5, 2.0, -0.25])
    bootstrap = torch.tensor([0.5, 1.0, 0.0])
    got = categorical_projection(probs, reward, bootstrap, support)
    expected = torch.tensor(
        [
            # Tz = [0, 0.5, 1]: 0.2 -> atom 1; 0.5 split 0.25/0.25 on atoms 1, 2; 0.3 -> atom 2
            [0.0, 0.45, 0.55],
            # Tz = [1, 2, 3] clamped to v_max: all mass on atom 2
            [0.0, 0.0, 1.0],
            # done: Tz = -0.25 for every atom -> 0.25 on atom 0, 0.75 on atom 1
            [0.25, 0.75, 0.0],
        ]
    )
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_categorical_projection_conserves_mass_and_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    support = torch.linspace(-10, 10, 51)
    probs = torch.softmax(torch.randn(64, 51, generator=gen), -1)
    reward = 1.8 * torch.rand(64, generator=gen) - 0.9  # |Tz| <= 0.9 + 9 < 10: no clamping
    bootstrap = torch.full((64,), 0.9)
    got = categorical_projection(probs, reward, bootstrap, support)
    torch.testing.assert_close(got.sum(-1), torch.ones(64), atol=1e-5, rtol=0)
    # without clamping the linear split between neighbouring atoms preserves the mean:
    # E[m] = r + 0.9 E[p]
    torch.testing.assert_close(
        (got * support).sum(-1), reward + 0.9 * (probs * support).sum(-1), atol=1e-4, rtol=0
    )


def test_target_network_is_frozen_and_policy_cast() -> None:
    learner = tiny_learner(build, dataclasses.replace(SMALL, distributional=True), policy="bf16")
    trainable = {id(p) for p in learner.trainable_parameters()}
    assert trainable == {id(p) for p in learner.online.parameters()}
    assert all(not p.requires_grad for p in learner.target.parameters())
    assert any(k.startswith("target.") for k in learner.state_dict())
    dtypes = floating_dtypes(learner)
    assert dtypes.pop("online.support") == torch.float32
    assert dtypes.pop("target.support") == torch.float32
    assert set(dtypes.values()) == {torch.bfloat16}


@pytest.mark.parametrize("tau", [1.0, 0.25])
def test_target_update_hard_and_soft(tau: float) -> None:
    learner = tiny_learner(build, dataclasses.replace(SMALL, tau=tau))
    with torch.no_grad():
        for p in learner.online.parameters():
            p.fill_(2.0)
        for p in learner.target.parameters():
            p.fill_(-2.0)
    learner.update_target()
    expected = -2.0 + tau * 4.0  # target <- target + tau * (online - target)
    for p in learner.target.parameters():
        assert torch.equal(p, torch.full_like(p, expected))
    assert all(torch.equal(p, torch.full_like(p, 2.0)) for p in learner.online.parameters())


# --------------------------------------------------------------------------------------
# the RLLearner cycle


def _train(
    learner: DQNLearner,
    env: TradingEnv,
    policy_name: str,
    collects: int,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> list[torch.Tensor]:
    return train_learner(learner, env, policy_name, collects, monkeypatch, max_grad_norm=10.0)


def test_time_limit_bootstraps_from_the_state_before_the_reset() -> None:
    """Episodes end by a time limit only: the env hands the state before its reset as
    ``final_obs`` and the stored transition bootstraps from it (done False)."""
    config = dataclasses.replace(SMALL, n_step=1, episode_len=2)
    env, learner = tiny_env(config), tiny_learner(build, config)
    env.step(torch.full((config.num_envs,), 2))  # long
    t, asset = env.t.clone(), env.asset.clone()
    last = env.step(torch.zeros(config.num_envs, dtype=torch.int64))  # short; episodes end
    assert last.done.all() and last.final_obs is not None
    window = env.windows[t + 1 - (SHAPE.lookback - 1), asset].transpose(1, 2)
    torch.testing.assert_close(last.final_obs[0], window)  # the same asset, one bar on
    torch.testing.assert_close(last.final_obs[1], torch.full((config.num_envs,), -1.0))
    torch.testing.assert_close(last.next_obs[1], torch.zeros(config.num_envs))  # reset
    learner._ensure_storage(torch.float32, torch.device("cpu"))
    assert learner.nstep is not None
    out = learner.nstep.push(last)
    assert out is not None and not out.done.any()
    torch.testing.assert_close(out.bootstrap, torch.full((config.num_envs,), config.gamma))
    torch.testing.assert_close(out.next_obs[0], window)


@pytest.mark.parametrize("policy", ["f32", "bf16"])
@pytest.mark.parametrize("distributional", [False, True])
def test_collect_and_losses_cycle(
    policy: str, distributional: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(SMALL, distributional=distributional)
    learner = tiny_learner(build, config, policy)
    env = tiny_env(config, policy)
    target_before = [p.detach().clone() for p in learner.target.parameters()]
    losses = _train(learner, env, policy, collects=12, monkeypatch=monkeypatch)
    # 12 collects x 2 steps x 4 envs = 96 env transitions, minus the n-1 = 2 steps of lag
    assert learner.replay is not None and learner.replay.count == (24 - 2) * 4
    # learning starts at 32 stored transitions (after the 5th collect): 8 collects x 2 steps
    assert len(losses) == 16
    stacked = torch.stack(losses)
    assert stacked.dtype == torch.float32 and torch.isfinite(stacked).all()
    data_dtype = get_policy(policy).data_dtype
    assert learner.replay.window.dtype == data_dtype
    assert learner.nstep is not None and learner.nstep.window.dtype == data_dtype
    # 16 optimizer steps with target_update_period 3: the target moved to the online net
    assert learner.grad_steps == 16
    assert any(
        not torch.equal(a, b)
        for a, b in zip(target_before, learner.target.parameters(), strict=True)
    )
    # priorities were written back: not all items still carry the initial max priority
    assert learner.replay.priority[: learner.replay.size].unique().numel() > 1
    positions = learner.positions(env.observe())
    assert set(positions.tolist()) <= {-1.0, 0.0, 1.0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["f32", "bf16"])
def test_cycle_never_syncs_on_cuda(policy: str) -> None:
    config = dataclasses.replace(SMALL, distributional=True)
    torch.manual_seed(0)
    learner = build(config, SHAPE)
    gpu = get_policy(policy, "cuda")
    gpu.convert_module(learner)
    gen = torch.Generator().manual_seed(0)
    env = TradingEnv(
        gpu.convert_input(torch.randn(80, 2, 3, generator=gen)),
        (0.01 * torch.randn(80, 2, generator=gen)).to("cuda"),
        SHAPE.lookback,
        (3, 79),
        config.num_envs,
        config.episode_len,
        cost=1e-3,
    )
    for i in range(5):  # warm up past learning_starts
        learner.collect(env, i / 10)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(5, 10):
            learner.collect(env, i / 10)
            for loss in learner.losses():
                loss.float().backward()
                learner.after_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --------------------------------------------------------------------------------------
# resume


@pytest.mark.parametrize("policy", ["f32", "bf16"])
def test_buffer_state_round_trip_resumes_exactly(policy: str) -> None:
    config = dataclasses.replace(SMALL, distributional=True)
    learner, env = tiny_learner(build, config, policy, seed=0), tiny_env(config, policy)
    _train(learner, env, policy, collects=9)
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
    assert resumed.replay is not None and learner.replay is not None
    assert resumed.replay.window.dtype == get_policy(policy).data_dtype

    for run, run_env in ((learner, env), (resumed, resumed_env)):
        run.collect(run_env, 0.5)
    assert learner.replay.count == resumed.replay.count
    a, b = learner.replay.sample(16, 0.6), resumed.replay.sample(16, 0.6)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
    assert torch.equal(a.obs[0], b.obs[0]) and torch.equal(a.reward, b.reward)
    loss_a, loss_b = next(learner.losses()), next(resumed.losses())
    assert torch.equal(loss_a, loss_b)
