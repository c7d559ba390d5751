"""n-step accumulator against a plain reference loop; prioritized replay sampling
frequencies, importance weights, priority bookkeeping, dtypes and checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from scipy import stats

from models.base import Transition
from models.replay import NStepAccumulator, NStepTransition, PrioritizedReplay


def _items(values: list[float], dtype: torch.dtype = torch.float32) -> NStepTransition:
    """One transition per value; every stored field is derived from the value."""
    v = torch.tensor(values, dtype=torch.float32)
    b = v.shape[0]
    window = v[:, None, None].expand(b, 2, 3).to(dtype)  # (B, L=2, F=3)
    return NStepTransition(
        obs=(window, (v / 100).to(dtype)),
        action=v.to(torch.int64) % 3,
        reward=v * 0.5,
        done=v.to(torch.int64) % 2 == 1,
        next_obs=(window + 1, (v / 100 + 1).to(dtype)),
        discount=torch.full((b,), 0.9),
    )


def _replay(capacity: int, alpha: float, seed: int = 0, dtype=torch.float32) -> PrioritizedReplay:
    return PrioritizedReplay(capacity, (2, 3), dtype, "cpu", alpha=alpha, eps=1e-6, seed=seed)


# --------------------------------------------------------------------------------------
# n-step accumulator


@pytest.mark.parametrize("time_limit", [False, True])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_nstep_matches_reference_loop(n: int, time_limit: bool) -> None:
    """``time_limit``: the environment hands ``final_obs`` (the state before its reset), so
    episode ends are truncations: the return still stops there, but it bootstraps from
    ``final_obs`` (done False). Without it every episode end is terminal."""
    steps, envs, gamma = 40, 5, 0.9
    gen = torch.Generator().manual_seed(n)
    rewards = torch.randn(steps, envs, generator=gen)
    dones = torch.rand(steps, envs, generator=gen) < 0.2
    actions = torch.randint(0, 3, (steps, envs), generator=gen)
    positions = torch.rand(steps, envs, generator=gen) * 2 - 1
    next_positions = torch.rand(steps, envs, generator=gen) * 2 - 1
    # Windows encode (step, env) so every emitted observation can be traced back exactly.
    ids = torch.arange(steps)[:, None] * 100.0 + torch.arange(envs)[None, :]  # (T, N)
    windows = ids[:, :, None, None].expand(steps, envs, 2, 1)
    next_windows = windows + 0.5
    final_windows = windows + 0.25  # differs from next_windows: where done, next_obs is reset
    final_positions = next_positions + 3.0

    acc = NStepAccumulator(n, gamma, envs, (2, 1), torch.float32, "cpu")
    emitted: list[dict[str, torch.Tensor]] = []
    for t in range(steps):
        out = acc.push(
            Transition(
                obs=(windows[t], positions[t]),
                action=actions[t],
                reward=rewards[t],
                done=dones[t],
                next_obs=(next_windows[t], next_positions[t]),
                final_obs=(final_windows[t], final_positions[t]) if time_limit else None,
            )
        )
        assert (out is None) == (t < n - 1)
        if out is not None:
            emitted.append(
                {
                    "window": out.obs[0].clone(),
                    "position": out.obs[1].clone(),
                    "action": out.action.clone(),
                    "reward": out.reward,
                    "done": out.done,
                    "next_window": out.next_obs[0],
                    "next_position": out.next_obs[1],
                    "discount": out.discount,
                }
            )
    assert len(emitted) == steps - n + 1

    r, d = rewards.double().numpy(), dones.numpy()
    for t, got in enumerate(emitted):
        for e in range(envs):
            ret, k = 0.0, 0
            for j in range(n):  # the textbook loop: add rewards until n steps or episode end
                ret += gamma**j * r[t + j, e]
                k = j + 1
                if d[t + j, e]:
                    break
            last = t + k - 1
            assert got["reward"][e].item() == pytest.approx(ret, abs=1e-5)
            assert got["done"][e].item() == (bool(d[last, e]) and not time_limit)
            assert got["discount"][e].item() == pytest.approx(gamma**k, rel=1e-6)
            assert got["window"][e, 0, 0].item() == ids[t, e].item()
            assert got["position"][e].item() == positions[t, e].item()
            assert got["action"][e].item() == actions[t, e].item()
            successor = final_positions if time_limit else next_positions
            offset = 0.25 if time_limit else 0.5
            assert got["next_window"][e, 0, 0].item() == ids[last, e].item() + offset
            assert got["next_position"][e].item() == successor[last, e].item()


def test_nstep_state_round_trip_continues_identically() -> None:
    envs, gen = 3, torch.Generator().manual_seed(7)

    def step(t: int) -> Transition:
        w = torch.full((envs, 2, 1), float(t))
        return Transition(
            obs=(w, torch.zeros(envs)),
            action=torch.zeros(envs, dtype=torch.int64),
            reward=torch.randn(envs, generator=gen),
            done=torch.rand(envs, generator=gen) < 0.3,
            next_obs=(w + 1, torch.zeros(envs)),
        )

    a = NStepAccumulator(3, 0.95, envs, (2, 1), torch.float32, "cpu")
    steps = [step(t) for t in range(8)]
    for s in steps[:5]:
        a.push(s)
    b = NStepAccumulator(3, 0.95, envs, (2, 1), torch.float32, "cpu")
    b.load_state_dict(st_load(st_save(a.state_dict())))
    for s in steps[5:]:
        x, y = a.push(s), b.push(s)
        assert x is not None and y is not None
        torch.testing.assert_close(x.reward, y.reward, rtol=0, atol=0)
        torch.testing.assert_close(x.next_obs[0], y.next_obs[0], rtol=0, atol=0)
        assert torch.equal(x.done, y.done)


# --------------------------------------------------------------------------------------
# prioritized replay

PRIORITIES = [0.5, 1.0, 2.0, 3.0, 4.0, 8.0]


def _prioritized(alpha: float, seed: int = 0) -> PrioritizedReplay:
    replay = _replay(len(PRIORITIES), alpha, seed)
    replay.add(_items([float(i) for i in range(len(PRIORITIES))]))
    replay.update_priorities(torch.arange(len(PRIORITIES)), torch.tensor(PRIORITIES))
    return replay


def test_per_sampling_frequencies_follow_priorities() -> None:
    alpha, draws, batch = 0.7, 200, 256
    replay = _prioritized(alpha)
    counts = torch.zeros(len(PRIORITIES))
    for _ in range(draws):
        sample = replay.sample(batch, beta=0.4)
        counts += torch.bincount(sample.indices, minlength=len(PRIORITIES))
        # the row index is stored in the window: sampled contents match their indices
        assert torch.equal(sample.obs[0][:, 0, 0].to(torch.int64), sample.indices)

    p = (np.array(PRIORITIES) + 1e-6) ** alpha
    expected = p / p.sum()
    total = draws * batch
    chi2 = stats.chisquare(counts.numpy(), expected * total)
    assert chi2.pvalue > 1e-3, (counts / total, expected)
    np.testing.assert_allclose(counts.numpy() / total, expected, atol=0.006)
    np.testing.assert_allclose(replay.probabilities().numpy(), expected, rtol=1e-5)


def test_importance_weights_match_formula() -> None:
    alpha, beta = 0.6, 0.55
    replay = _prioritized(alpha, seed=3)
    sample = replay.sample(64, beta=beta)
    p = (np.array(PRIORITIES, dtype=np.float64) + 1e-6) ** alpha
    probs = p / p.sum()
    n = len(PRIORITIES)
    w = (n * probs) ** -beta
    drawn = w[sample.indices.numpy()]
    expected = drawn / drawn.max()  # normalized by the batch's largest weight (Rainbow)
    np.testing.assert_allclose(sample.weights.double().numpy(), expected, rtol=1e-5)
    assert sample.weights.dtype == torch.float32
    assert sample.weights.max().item() == 1.0


def test_importance_weights_ignore_near_zero_priorities_outside_the_batch() -> None:
    # One stored item with |TD| ~ 0 (a flat-to-flat step earns exactly 0) must not scale
    # every batch's weights down: that made the loss read 0 and the steps shrink.
    replay = _replay(64, alpha=0.5)
    replay.add(_items([float(i) for i in range(64)]))
    replay.update_priorities(torch.arange(64), torch.full((64,), 1.0))
    replay.update_priorities(torch.tensor([0]), torch.tensor([0.0]))
    sample = replay.sample(32, beta=1.0)
    assert not (sample.indices == 0).any()  # P(item 0) ~ 2e-5: not drawn with this seed
    assert torch.allclose(sample.weights, torch.ones(32))


def test_alpha_zero_is_uniform_with_unit_weights() -> None:
    replay = _prioritized(alpha=0.0, seed=1)
    np.testing.assert_allclose(replay.probabilities().numpy(), np.full(6, 1 / 6), rtol=1e-6)
    counts = torch.zeros(6)
    for _ in range(100):
        sample = replay.sample(256, beta=0.4)
        assert torch.equal(sample.weights, torch.ones(256))
        counts += torch.bincount(sample.indices, minlength=6)
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3


def test_circular_writes_and_max_priority_for_new_items() -> None:
    replay = _replay(5, alpha=0.5)
    replay.add(_items([10.0, 11.0, 12.0]))
    assert replay.size == 3
    # fresh items start at the initial max priority 1
    torch.testing.assert_close(replay.priority[:3], torch.ones(3))
    replay.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([7.0, 0.25, 2.0]))
    replay.add(_items([13.0, 14.0, 15.0]))  # rows 3, 4 and wraps to 0
    assert replay.count == 6 and replay.size == 5
    assert replay.window[:, 0, 0].tolist() == [15.0, 11.0, 12.0, 13.0, 14.0]
    assert replay.next_position.tolist() == pytest.approx([1.15, 1.11, 1.12, 1.13, 1.14])
    assert replay.done.tolist() == [True, True, False, True, False]
    max_p = 7.0 + 1e-6
    torch.testing.assert_close(
        replay.priority, torch.tensor([max_p, 0.25 + 1e-6, 2.0 + 1e-6, max_p, max_p])
    )


def test_update_priorities_duplicates_and_non_finite() -> None:
    replay = _replay(4, alpha=1.0)
    replay.add(_items([0.0, 1.0, 2.0, 3.0]))
    replay.update_priorities(torch.tensor([1, 1, 2]), torch.tensor([2.0, 5.0, 0.5]))
    assert replay.priority[1].item() == pytest.approx(5.0 + 1e-6)
    assert replay.max_priority.item() == pytest.approx(5.0 + 1e-6)
    replay.update_priorities(torch.tensor([3]), torch.tensor([float("nan")]))
    assert replay.priority[3].item() == pytest.approx(5.0 + 2e-6)  # max priority + eps
    assert torch.isfinite(replay.probabilities()).all()


def test_replay_stores_bf16_observations() -> None:
    replay = _replay(8, alpha=0.5, dtype=torch.bfloat16)
    items = _items([1.0, 2.5, 3.0], dtype=torch.bfloat16)
    replay.add(items)
    assert replay.window.dtype == torch.bfloat16
    assert replay.next_window.dtype == torch.bfloat16
    assert replay.position.dtype == torch.bfloat16
    assert replay.reward.dtype == torch.float32 and replay.discount.dtype == torch.float32
    sample = replay.sample(4, beta=0.5)
    assert sample.obs[0].dtype == torch.bfloat16 and sample.reward.dtype == torch.float32
    assert replay.window[:3, 0, 0].tolist() == [1.0, 2.5, 3.0]
    with pytest.raises(ValueError, match=r"stores observations as torch\.bfloat16"):
        replay.add(_items([4.0]))  # f32 windows into a bf16 buffer


def test_state_round_trip_reproduces_next_sample() -> None:
    replay = _replay(16, alpha=0.6, seed=11, dtype=torch.bfloat16)
    replay.add(_items([float(i) for i in range(10)], dtype=torch.bfloat16))
    replay.update_priorities(torch.arange(10), torch.linspace(0.1, 3.0, 10))
    replay.sample(8, beta=0.5)  # advance the generator
    state = replay.state_dict()
    assert state["window"].shape == (10, 2, 3)  # only the filled part is stored
    restored = _replay(16, alpha=0.6, seed=99, dtype=torch.bfloat16)
    restored.load_state_dict(st_load(st_save(state)))
    a, b = replay.sample(32, beta=0.7), restored.sample(32, beta=0.7)
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(a.weights, b.weights)
    assert torch.equal(a.obs[0], b.obs[0])
    assert restored.count == 10
    with pytest.raises(ValueError, match="capacity 16"):
        _replay(8, alpha=0.6).load_state_dict(state)
