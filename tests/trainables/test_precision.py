"""Precision policies: dtypes each policy promises, the guarded step, Kahan updates,
fp16 loss scaling and the bf16 -> f32 fallback counters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainables import precision
from trainables.optim import GuardedAdamW
from trainables.precision import (
    BF16,
    F32,
    FP16,
    POLICY_NAMES,
    DeviceInfo,
    LossScaler,
    StepGuard,
    get_policy,
    resolve_policy_name,
)

CPU = torch.device("cpu")


class Tiny(nn.Module):
    keep_f32 = ("support",)

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)
        self.register_buffer("support", torch.linspace(-1, 1, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _one_step(policy_name: str) -> tuple[nn.Module, GuardedAdamW, list[torch.dtype]]:
    policy = get_policy(policy_name, CPU)
    model = policy.convert_module(Tiny())
    opt = policy.make_optimizer(model.parameters(), lr=1e-3)
    x = policy.convert_input(torch.randn(16, 4))
    seen: list[torch.dtype] = []
    with policy.autocast():
        loss = model(x).square().mean()
    loss.register_hook(lambda g: seen.append(g.dtype))
    # The hook above sees the gradient of the loss *as returned by the model*; the policy
    # casts to f32 first, so record the dtype of what reaches backward separately.
    original = torch.Tensor.backward

    def spy(self: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(self.dtype)
        return original(self, *args, **kwargs)

    torch.Tensor.backward = spy  # type: ignore[method-assign]
    try:
        policy.backward_and_step(
            loss, opt, StepGuard(CPU), max_grad_norm=1.0, scaler=policy.make_scaler()
        )
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]
    return model, opt, seen


@pytest.mark.parametrize(
    ("policy", "param_dtype", "data_dtype"),
    [
        ("f32", F32, F32),
        ("tf32", F32, F32),
        ("bf16", BF16, BF16),
        ("bf16-mixed", F32, F32),
        ("fp16-mixed", F32, F32),
    ],
)
def test_policy_dtypes(policy: str, param_dtype: torch.dtype, data_dtype: torch.dtype) -> None:
    model, opt, seen = _one_step(policy)
    assert get_policy(policy, CPU).data_dtype == data_dtype
    assert model.fc1.weight.dtype == param_dtype
    assert model.fc1.weight.grad is not None and model.fc1.weight.grad.dtype == param_dtype
    assert model.support.dtype == F32  # listed in keep_f32: stays f32 under every policy
    for state in opt.state.values():
        assert state["exp_avg"].dtype == F32 and state["exp_avg_sq"].dtype == F32
        if param_dtype == BF16:
            assert state["compensation"].dtype == BF16
        else:
            assert "compensation" not in state
    assert seen[0] == F32  # the tensor backward() is called on is f32


def test_mixed_policies_compute_in_low_precision() -> None:
    x = torch.randn(3, 4)
    layer = nn.Linear(4, 2)
    with get_policy("bf16-mixed", CPU).autocast():
        assert layer(x).dtype == BF16
    with get_policy("fp16-mixed", CPU).autocast():
        assert layer(x).dtype == FP16


def test_auto_resolves_to_f32_without_cuda() -> None:
    assert resolve_policy_name("auto", CPU) == "f32"
    with pytest.raises(ValueError, match="unknown precision policy 'fp8'"):
        resolve_policy_name("fp8", CPU)


def _drift(param_dtype: torch.dtype, kahan: bool, steps: int = 2000, lr: float = 1e-4) -> float:
    """Move weights near 1.0 with a constant gradient; return the mean distance travelled."""
    w = nn.Parameter(torch.full((256,), 1.0, dtype=param_dtype))
    opt = GuardedAdamW([w], lr=lr, kahan=kahan, state_dtype=F32)
    for _ in range(steps):
        w.grad = torch.ones_like(w)  # Adam's normalized step is ~lr each time
        opt.step()
    return float((1.0 - opt.master_weight(w)).mean())


def test_kahan_keeps_small_bf16_updates_that_rounding_loses() -> None:
    exact = _drift(F32, kahan=False)
    naive = _drift(BF16, kahan=False)
    compensated = _drift(BF16, kahan=True)
    assert exact == pytest.approx(0.2, rel=1e-3)  # 2000 steps x lr 1e-4
    assert naive == 0.0  # 1e-4 is below half a bf16 ulp at 1.0 (2^-9): every update rounds away
    assert compensated == pytest.approx(exact, rel=0.01)  # within 1% of f32


def test_nonfinite_step_is_skipped_and_counted() -> None:
    policy = get_policy("f32", CPU)
    model = policy.convert_module(Tiny())
    opt = policy.make_optimizer(model.parameters(), lr=1e-2)
    guard = StepGuard(CPU)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = model(torch.randn(8, 4)).mean() * float("nan")
    result = policy.backward_and_step(loss, opt, guard, max_grad_norm=1.0)
    assert not bool(result.ok)
    assert int(guard.skipped) == 1 and int(guard.longest_streak) == 1
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    assert all(float(s["step"]) == 0.0 for s in opt.state.values())
    good = model(torch.randn(8, 4)).square().mean()
    policy.backward_and_step(good, opt, guard, max_grad_norm=1.0)
    assert int(guard.skipped) == 1 and int(guard.streak) == 0 and int(guard.longest_streak) == 1
    assert all(float(s["step"]) == 1.0 for s in opt.state.values())


def test_streak_counts_consecutive_skips_only() -> None:
    guard = StepGuard(CPU)
    for ok in [True, False, False, True, False, False, False, True]:
        guard.record(torch.tensor(ok))
    assert int(guard.skipped) == 5
    assert int(guard.longest_streak) == 3
    assert int(guard.streak) == 0


def test_fp16_loss_scale_grows_and_backs_off() -> None:
    scaler = LossScaler(CPU, growth_interval=3)
    assert float(scaler.scale) == 2.0**16
    for _ in range(3):
        scaler.update(torch.tensor(True))
    assert float(scaler.scale) == 2.0**17  # x2 after growth_interval clean steps
    assert int(scaler.clean_steps) == 0
    scaler.update(torch.tensor(True))
    scaler.update(torch.tensor(False))
    assert float(scaler.scale) == 2.0**16  # x0.5 on a non-finite step
    assert int(scaler.clean_steps) == 0
    default = LossScaler(CPU)
    assert (
        default.init_scale,
        default.growth_factor,
        default.backoff_factor,
        default.growth_interval,
    ) == (
        2.0**16,
        2.0,
        0.5,
        2000,
    )


def test_fp16_overflow_skips_step_and_halves_scale() -> None:
    policy = get_policy("fp16-mixed", CPU)
    model = policy.convert_module(Tiny())
    opt = policy.make_optimizer(model.parameters(), lr=1e-3)
    scaler = policy.make_scaler()
    guard = StepGuard(CPU)
    x = torch.randn(8, 4)
    with policy.autocast():
        loss = model(x).square().mean() * 1e30  # scaled by 2^16 it overflows f32 gradients
    before = model.fc1.weight.detach().clone()
    result = policy.backward_and_step(loss, opt, guard, max_grad_norm=None, scaler=scaler)
    assert not bool(result.ok)
    assert float(scaler.scale) == 2.0**15
    assert torch.equal(model.fc1.weight, before)
    with policy.autocast():
        loss = model(x).square().mean()
    result = policy.backward_and_step(loss, opt, guard, max_grad_norm=None, scaler=scaler)
    assert bool(result.ok)
    assert float(result.loss) == pytest.approx(
        float(loss.detach()), rel=1e-6
    )  # unscaled loss reported
    assert not torch.equal(model.fc1.weight, before)


def test_gradient_clipping_scales_the_gradient_the_moments_see() -> None:
    """Adam's first update is g/|g| with or without clipping, so the weights cannot show
    it; the moments can: they hold the clipped gradient (0.6, 0.8) times (1 - beta)."""
    policy = get_policy("f32", CPU)
    w = nn.Parameter(torch.zeros(4))
    opt = policy.make_optimizer([w], lr=1.0)
    loss = (w * torch.tensor([300.0, 400.0, 0.0, 0.0])).sum()
    result = policy.backward_and_step(loss, opt, StepGuard(CPU), max_grad_norm=1.0)
    assert float(result.grad_norm) == pytest.approx(500.0)  # reported before clipping
    clipped = torch.tensor([0.6, 0.8, 0.0, 0.0])
    torch.testing.assert_close(opt.state[w]["exp_avg"], 0.1 * clipped, rtol=1e-5, atol=0)
    torch.testing.assert_close(
        opt.state[w]["exp_avg_sq"], 0.001 * clipped.square(), rtol=1e-5, atol=0
    )


def test_clipped_trajectory_follows_torch_adamw_on_clipped_gradients() -> None:
    """Several steps whose gradient norms differ (so the clip factor differs per step)
    end where torch's AdamW ends when fed the clipped gradients."""
    scales = [50.0, 0.5, 300.0, 2.0, 40.0, 0.1]
    direction = torch.tensor([3.0, -4.0, 1.0, 0.5])
    policy = get_policy("f32", CPU)
    ours = nn.Parameter(torch.full((4,), 0.5))
    ref = nn.Parameter(torch.full((4,), 0.5))
    opt = policy.make_optimizer([ours], lr=0.05)
    ref_opt = torch.optim.AdamW([ref], lr=0.05, weight_decay=0.0)
    guard = StepGuard(CPU)
    for k, scale in enumerate(scales):
        target = direction * scale * (1 + 0.1 * k)
        policy.backward_and_step((ours * target).sum() + ours.square().sum(), opt, guard, 1.0)
        ref_opt.zero_grad()
        ((ref * target).sum() + ref.square().sum()).backward()
        torch.nn.utils.clip_grad_norm_([ref], 1.0)
        ref_opt.step()
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref.detach(), torch.full((4,), 0.5))  # it moved


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((7, 5), False), ((8, 0), True), ((8, 6), True), ((9, 0), True), ((6, 1), False)],
)
def test_bf16_support_is_ampere_or_newer(
    capability: tuple[int, int], expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = DeviceInfo(type="cuda", name="fake", capability=capability)
    assert info.supports_bf16 is expected
    assert info.supports_tf32 is expected
    monkeypatch.setattr(precision, "describe_device", lambda _device: info)
    cuda = torch.device("cuda")
    assert resolve_policy_name("auto", cuda) == ("bf16" if expected else "f32")


def test_no_bf16_support_without_a_cuda_capability() -> None:
    assert not DeviceInfo(type="cpu", name="cpu", capability=None).supports_bf16
    assert not DeviceInfo(type="cuda", name="odd", capability=None).supports_bf16
    assert not DeviceInfo(type="mps", name="mps", capability=(9, 0)).supports_bf16


# --------------------------------------------------------------------------------------
# tf32


def test_tf32_is_a_policy_name() -> None:
    assert "tf32" in POLICY_NAMES
    assert get_policy("tf32", CPU).name == "tf32"


def test_tf32_trains_exactly_like_f32_on_cpu() -> None:
    weights = {}
    for name in ("f32", "tf32"):
        torch.manual_seed(0)
        policy = get_policy(name, CPU)
        model = policy.convert_module(Tiny())
        opt = policy.make_optimizer(model.parameters(), lr=1e-2)
        guard = StepGuard(CPU)
        for k in range(5):
            x = policy.convert_input(torch.randn(16, 4, generator=torch.Generator().manual_seed(k)))
            with policy.autocast():
                loss = model(x).square().mean()
            policy.backward_and_step(loss, opt, guard, max_grad_norm=1.0)
        weights[name] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(weights["f32"], weights["tf32"], strict=True):
        assert torch.equal(a, b)


def test_tf32_is_reported_only_on_ampere_or_newer() -> None:
    ampere = DeviceInfo(type="cuda", name="A100", capability=(8, 0))
    turing = DeviceInfo(type="cuda", name="T4", capability=(7, 5))
    cpu = DeviceInfo(type="cpu", name="cpu", capability=None)
    tf32, strict = get_policy("tf32", CPU), get_policy("f32", CPU)
    assert tf32.float32_matmul(ampere) == "tf32"
    assert tf32.float32_matmul(turing) == "ieee"
    assert tf32.float32_matmul(cpu) == "ieee"
    assert tf32.float32_matmul() == "ieee"  # this policy's own device: the CPU
    assert strict.float32_matmul(ampere) == "ieee"  # f32 stays strict f32


def _cuda_fp32_flags() -> tuple[str, str, str]:
    backends = torch.backends
    return (
        backends.cuda.matmul.fp32_precision,
        backends.cudnn.conv.fp32_precision,
        backends.cudnn.rnn.fp32_precision,
    )


def test_tf32_flags_are_scoped_to_the_policy_region() -> None:
    """On a CUDA device the tf32 region turns TF32 on and restores the flags after; the
    f32 region forces strict f32 even where the process was left in TF32 (a reused actor
    after a tf32 trial). The flags can be set without a GPU, so this runs on CPU."""
    cuda = torch.device("cuda")
    before = _cuda_fp32_flags()
    with precision._float32_matmul(cuda, allow_tf32=True):
        assert _cuda_fp32_flags() == ("tf32", "tf32", "tf32")
        with precision._float32_matmul(cuda, allow_tf32=False):
            assert _cuda_fp32_flags() == ("ieee", "ieee", "ieee")
        assert _cuda_fp32_flags() == ("tf32", "tf32", "tf32")
    assert _cuda_fp32_flags() == before
    # A policy on the CPU leaves the CUDA flags alone.
    with get_policy("tf32", CPU).autocast():
        assert _cuda_fp32_flags() == before
