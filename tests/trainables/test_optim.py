"""The multi-tensor guarded AdamW (trainables/optim.py) against the per-parameter
``GuardedAdamW`` it replaced (kept below, verbatim, as the reference): identical weights,
moments, step counts and Kahan compensation on fixed steps (plain, clipped, fp16
loss-scaled, skipped, weight decay, bf16 with f32 islands); the same checkpoint state;
no host read in the guarded step; an op count that does not grow with the number of
parameter tensors."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tests.devices import ON_CUDA
from tests.models.rl_loop import NoHostReads
from trainables.optim import GuardedAdamW
from trainables.precision import BF16, FP16, POLICY_NAMES, StepGuard, get_policy

F32 = torch.float32
CPU = torch.device("cpu")

# --------------------------------------------------------------------------------------
# Reference: the per-parameter optimizer and guarded-step pieces before trainables/optim.py


def _is_low_precision(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


class ReferenceGuardedAdamW(torch.optim.Optimizer):
    """The old per-parameter loop (~25-35 small ops per parameter tensor)."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        kahan: bool = True,
    ) -> None:
        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr must be a positive finite number, got {lr}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.kahan = kahan

    def init_state(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if state:
                    continue
                state["step"] = torch.zeros((), dtype=F32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, dtype=F32)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=F32)
                if self.kahan and _is_low_precision(p.dtype):
                    state["compensation"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(  # type: ignore[override]
        self,
        closure: None = None,
        *,
        ok: torch.Tensor | None = None,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        self.init_state()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                grad = p.grad.float()
                if grad_scale is not None:
                    grad = grad * grad_scale
                if ok is None:
                    live = torch.ones((), dtype=F32, device=p.device)
                else:
                    live = ok.to(F32)
                    grad = torch.where(ok, grad, torch.zeros((), dtype=F32, device=p.device))
                step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
                step.add_(live)
                exp_avg.lerp_(grad, live * (1 - beta1))
                exp_avg_sq.mul_(1 - live * (1 - beta2)).addcmul_(grad, grad, value=1 - beta2)
                safe_step = step.clamp(min=1.0)
                bias1 = 1 - beta1**safe_step
                bias2 = 1 - beta2**safe_step
                denom = (exp_avg_sq / bias2).sqrt_().add_(eps)
                update = (exp_avg / bias1).div_(denom)
                if wd:
                    update.add_(p.float(), alpha=wd)
                update.mul_(live * -lr)
                self._apply_update(p, update, state.get("compensation"))

    @staticmethod
    def _apply_update(
        p: torch.Tensor, update: torch.Tensor, compensation: torch.Tensor | None
    ) -> None:
        if p.dtype == F32:
            p.add_(update)
            return
        if compensation is None:
            p.copy_(p.float() + update)
            return
        wanted = update + compensation.float()
        before = p.float()
        p.copy_(before + wanted)
        compensation.copy_(wanted - (p.float() - before))


def reference_grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The old global norm: per-tensor norms in the gradient dtype, then their norm."""
    norms = torch._foreach_norm([p.grad for p in params])  # type: ignore[misc]
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))


def reference_grad_scale(
    grad_norm: torch.Tensor, max_grad_norm: float | None, scale: torch.Tensor | None
) -> torch.Tensor:
    """The old folding of clipping and the fp16 unscale into one factor."""
    grad_scale = torch.ones((), dtype=F32)
    if scale is not None:
        grad_scale = grad_scale / scale
    if max_grad_norm is not None:
        clip = (max_grad_norm / (grad_norm + 1e-6)).clamp(max=1.0)
        grad_scale = grad_scale * torch.nan_to_num(clip, nan=0.0, posinf=0.0)
    return grad_scale


# --------------------------------------------------------------------------------------
# Equivalence on fixed steps


class Net(nn.Module):
    """Two low-precision layers with odd sizes and an f32 island (``gain``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 3)).to(dtype)
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.to(self.net[0].weight.dtype)).float() * self.gain


# (ok, grad_scale, poison): a plain step, a clipped one, a skipped one with a NaN
# gradient, an fp16-style unscale (gradients x 2^16, scale 2^-16), another clipped one.
STEPS = [
    (True, None, False),
    (True, 0.37, False),
    (False, 0.5, True),
    (True, 2.0**-16, False),
    (True, 0.81, False),
    (True, 1.0, False),
]


def _pair(
    dtype: torch.dtype, wd: float, kahan: bool, device: torch.device = CPU
) -> tuple[Net, Net, object, GuardedAdamW]:
    torch.manual_seed(0)
    old_net = Net(dtype).to(device)
    torch.manual_seed(0)
    new_net = Net(dtype).to(device)
    old = ReferenceGuardedAdamW(old_net.parameters(), lr=3e-3, weight_decay=wd, kahan=kahan)
    new = GuardedAdamW(new_net.parameters(), lr=3e-3, weight_decay=wd, kahan=kahan, state_dtype=F32)
    old.init_state()
    new.init_state()
    return old_net, new_net, old, new


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])  # CUDA: the multi-tensor kernels
@pytest.mark.parametrize(
    ("dtype", "wd", "kahan"),
    [
        (F32, 0.0, True),
        (F32, 0.01, True),
        (BF16, 0.0, True),
        (BF16, 0.01, True),
        (FP16, 0.0, True),
        (BF16, 0.0, False),
    ],
)
def test_multi_tensor_step_matches_the_per_parameter_one_bit_for_bit(
    dtype: torch.dtype, wd: float, kahan: bool, device: str
) -> None:
    old_net, new_net, old, new = _pair(dtype, wd, kahan, torch.device(device))
    for k, (keep, scale, poison) in enumerate(STEPS):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(k)).to(device)
        for net in (old_net, new_net):
            net.zero_grad(set_to_none=False)
            loss = net(x).square().mean() * (2.0**16 if scale == 2.0**-16 else 1.0)
            loss.backward()
            if poison:
                net.net[0].weight.grad[0, 0] = float("nan")
        ok = torch.tensor(keep, device=device)
        grad_scale = None if scale is None else torch.tensor(scale, device=device)
        old.step(ok=ok, grad_scale=grad_scale)
        new.step(ok=ok, grad_scale=grad_scale)
        for (name, p), q in zip(old_net.named_parameters(), new_net.parameters(), strict=True):
            assert torch.equal(p, q), (k, name)
            for key, value in old.state[p].items():
                assert torch.equal(value, new.state[q][key]), (k, name, key)
    steps = {float(s["step"]) for s in new.state.values()}
    assert steps == {len(STEPS) - 1.0}  # the skipped step did not count


def test_checkpoint_state_keeps_keys_shapes_and_dtypes() -> None:
    old_net, new_net, old, new = _pair(BF16, 0.0, True)
    for (name, p), q in zip(old_net.named_parameters(), new_net.parameters(), strict=True):
        assert set(old.state[p]) == set(new.state[q]), name
        for key, value in old.state[p].items():
            other = new.state[q][key]
            assert (other.shape, other.dtype) == (value.shape, value.dtype), (name, key)
    # State entries are views of shared arenas, but never overlap: safetensors saves them.
    from safetensors.torch import save

    flat = {
        f"{i}.{k}": v for i, q in enumerate(new_net.parameters()) for k, v in new.state[q].items()
    }
    assert save(flat)


def test_restore_by_copy_and_replaced_state_both_reach_the_update() -> None:
    """The trainer restores by copying into the state tensors; load_state_dict takes
    torch's format (here a torch.optim.Optimizer's). Both must be what the next step
    reads."""
    old_net, new_net, old, new = _pair(F32, 0.0, True)
    for net, opt in ((old_net, old), (new_net, new)):
        net(torch.ones(2, 7)).sum().backward()
        for p in net.parameters():
            opt.state[p]["exp_avg"].copy_(torch.full_like(p, 0.25))
            opt.state[p]["step"].fill_(7.0)
        opt.step()
    for p, q in zip(old_net.parameters(), new_net.parameters(), strict=True):
        assert torch.equal(p, q)
    new.load_state_dict(copy.deepcopy(old.state_dict()))  # torch's format, copied in
    for net, opt in ((old_net, old), (new_net, new)):
        net.zero_grad(set_to_none=False)
        net(torch.ones(2, 7)).square().sum().backward()
        opt.step()
    for p, q in zip(old_net.parameters(), new_net.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_state_dict_round_trip_continues_bit_for_bit() -> None:
    """state_dict -> load_state_dict into a fresh optimizer (bf16 weights: Kahan
    compensation, a skipped step) continues exactly as the original does."""
    _, net, _, opt = _pair(BF16, 0.01, True)
    for k, (keep, scale, poison) in enumerate(STEPS[:3]):
        net.zero_grad(set_to_none=False)
        net(
            torch.randn(5, 7, generator=torch.Generator().manual_seed(k))
        ).square().mean().backward()
        if poison:
            net.net[0].weight.grad[0, 0] = float("nan")
        opt.step(ok=torch.tensor(keep), grad_scale=None if scale is None else torch.tensor(scale))
    twin = copy.deepcopy(net)
    saved = copy.deepcopy(opt.state_dict())
    keys = [sorted(values) for values in saved["state"].values()]
    assert ["compensation", "exp_avg", "exp_avg_sq", "step"] in keys  # the bf16 weights
    assert saved["param_groups"][0]["params"] == list(range(len(list(net.parameters()))))
    other = GuardedAdamW(twin.parameters(), lr=1.0, state_dtype=F32)  # lr comes from the state dict
    other.init_state()
    other.load_state_dict(saved)
    assert other.param_groups[0]["lr"] == 3e-3
    for model, optimizer in ((net, opt), (twin, other)):
        for k in range(3):
            model.zero_grad(set_to_none=False)
            x = torch.randn(5, 7, generator=torch.Generator().manual_seed(10 + k))
            model(x).square().mean().backward()
            optimizer.step(ok=torch.tensor(True))
    for (name, p), q in zip(net.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q), name
        for key, value in opt.state[p].items():
            assert torch.equal(value, other.state[q][key]), (name, key)


def test_load_state_dict_fills_what_the_saved_state_lacks_and_refuses_what_does_not_fit() -> None:
    """A torch AdamW's state (no compensation) keeps Kahan on with a zero compensation; a
    parameter the saved state lacks starts fresh; a wrong shape or amsgrad's extra moment
    is refused naming the parameter, before anything is changed."""
    torch.manual_seed(0)
    w16 = nn.Parameter(torch.randn(4).to(BF16))
    w32 = nn.Parameter(torch.randn(3))
    opt = GuardedAdamW([w16, w32], lr=1e-2, state_dtype=F32)
    for _ in range(2):
        (w16.float().square().sum() + w32.square().sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    assert float(opt.state[w16]["compensation"].abs().sum()) > 0
    plain = {
        "state": {
            0: {"step": 5.0, "exp_avg": torch.ones(4), "exp_avg_sq": torch.ones(4)}
        },  # a python-number step, as older torch saved it; parameter 1 has no state
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "params": [0, 1]}],
    }
    arena_moments = opt._arenas[(0, CPU)].moments
    opt.load_state_dict(plain)
    assert float(opt.state[w16]["step"]) == 5.0 and opt.state[w16]["exp_avg"].dtype == F32
    assert torch.equal(opt.state[w16]["compensation"], torch.zeros(4, dtype=BF16))
    assert float(opt.state[w32]["step"]) == 0.0 and not opt.state[w32]["exp_avg"].any()
    assert opt._arenas[(0, CPU)].moments is arena_moments  # copied in, not replaced
    (w16.float().square().sum() + w32.square().sum()).backward()
    opt.step()
    assert float(opt.state[w16]["step"]) == 6.0 and float(opt.state[w32]["step"]) == 1.0
    assert float(opt.state[w16]["compensation"].abs().sum()) > 0  # Kahan still on
    before = {k: v.clone() for k, v in opt.state[w16].items()}
    wrong = copy.deepcopy(plain)
    wrong["state"][0]["exp_avg"] = torch.ones(2, 2)
    with pytest.raises(
        ValueError, match=r"parameter 0 of the state dict: exp_avg has shape \(2, 2\)"
    ):
        opt.load_state_dict(wrong)
    amsgrad = copy.deepcopy(plain)
    amsgrad["state"][0]["max_exp_avg_sq"] = torch.ones(4)
    with pytest.raises(ValueError, match=r"state keys \['max_exp_avg_sq'\]"):
        opt.load_state_dict(amsgrad)
    for key, value in before.items():
        assert torch.equal(opt.state[w16][key], value), key


def test_load_state_dict_reaches_a_parameter_that_never_had_a_gradient() -> None:
    """Arenas are built from the parameters with gradients; a loaded state for one that
    never had one must still be what its first step reads (it was dropped silently)."""
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    opt = GuardedAdamW([a, b], lr=0.1, state_dtype=F32)
    a.sum().backward()
    opt.step()  # only a is in an arena
    saved = opt.state_dict()
    saved["state"][1] = {
        "step": torch.tensor(7.0),
        "exp_avg": torch.full((3,), 2.0),
        "exp_avg_sq": torch.full((3,), 4.0),
    }
    saved["param_groups"][0]["params"] = [0, 1]
    opt.load_state_dict(saved)
    assert float(opt.state[b]["step"]) == 7.0 and torch.equal(
        opt.state[b]["exp_avg"], torch.full((3,), 2.0)
    )
    b.sum().backward()
    opt.step()
    assert float(opt.state[b]["step"]) == 8.0
    assert torch.allclose(opt.state[b]["exp_avg"], torch.full((3,), 0.9 * 2.0 + 0.1))
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        opt.load_state_dict(
            {**saved, "param_groups": [{**saved["param_groups"][0], "amsgrad": True}]}
        )
    with pytest.raises(ValueError, match="a parameter index appears twice"):
        opt.load_state_dict(
            {**saved, "param_groups": [{**saved["param_groups"][0], "params": [0, 0]}]}
        )


def test_param_groups_follow_torchs_rules_and_name_what_is_wrong() -> None:
    a, b = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(3))
    opt = GuardedAdamW([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1, state_dtype=F32)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["params"] == [b] and opt.param_groups[0]["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="more than one place"):
        GuardedAdamW([{"params": [a]}, {"params": [a, b]}], state_dtype=F32)
    with pytest.raises(
        ValueError, match=r"param group 0: unknown hyperparameters \['weight_decy'\]"
    ):
        GuardedAdamW([{"params": [a], "weight_decy": 0.1}], state_dtype=F32)
    with pytest.raises(ValueError, match="empty parameter list"):
        GuardedAdamW([], state_dtype=F32)
    with pytest.raises(ValueError, match="param group 0: the state dict has 1 parameters"):
        GuardedAdamW([a, b], state_dtype=F32).load_state_dict(
            GuardedAdamW([a], state_dtype=F32).state_dict()
        )


def test_step_post_hooks_run_after_each_step_until_removed() -> None:
    w = nn.Parameter(torch.ones(3))
    opt = GuardedAdamW([w], lr=0.1, state_dtype=F32)
    seen: list[float] = []
    handle = opt.register_step_post_hook(lambda optimizer, *_: seen.append(float(w[0])))
    for _ in range(2):
        w.sum().backward()
        opt.step()
    handle.remove()
    w.sum().backward()
    opt.step()
    assert len(seen) == 2 and seen[0] < 1.0 and seen[1] < seen[0]  # after the update


def test_training_and_resuming_never_import_torch_dynamo(tmp_path: Path) -> None:
    """torch.optim.Optimizer's methods import torch._dynamo on first call (about a second
    and 67 MiB in every trial process); the trainer's optimizer is not one. A fresh
    process trains bf16, checkpoints, resumes and trains on, as a trial does."""
    script = f"""
import importlib.abc, sys, traceback
importer = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo" and not importer:
            importer.append("".join(traceback.format_stack(limit=12)))
sys.meta_path.insert(0, Watch())
import trainables.trial  # what a Ray trial actor imports
from tests.trainables.helpers import tiny_config
from trainables.checkpoint import load_checkpoint
from trainables.trainer import Trainer
first = Trainer(tiny_config(precision="bf16", epochs=1, max_steps_per_epoch=2))
first.fit()
first.save(__import__("pathlib").Path({str(tmp_path)!r}) / "ckpt")
ckpt = load_checkpoint({str(tmp_path)!r} + "/ckpt")
Trainer(tiny_config(precision="bf16", epochs=2, max_steps_per_epoch=2), checkpoint=ckpt).fit()
print(*importer, file=sys.stderr)
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "dynamo imported: False", done.stderr[-3000:]


def test_a_parameter_that_gets_its_gradient_later_keeps_its_own_step_count() -> None:
    torch.manual_seed(0)
    a_old, b_old = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(5))
    a_new, b_new = nn.Parameter(a_old.detach().clone()), nn.Parameter(b_old.detach().clone())
    old = ReferenceGuardedAdamW([a_old, b_old], lr=1e-2)
    new = GuardedAdamW([a_new, b_new], lr=1e-2, state_dtype=F32)
    old.init_state()
    new.init_state()
    for k in range(4):
        for a, b, opt in ((a_old, b_old, old), (a_new, b_new, new)):
            loss = a.square().sum() * (k + 1) + (b.sum() if k >= 2 else 0.0)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    assert float(new.state[b_new]["step"]) == 2.0 and float(new.state[a_new]["step"]) == 4.0
    assert torch.equal(a_old, a_new) and torch.equal(b_old, b_new)


def test_guarded_step_matches_the_per_parameter_reference_and_reports_an_f32_norm() -> None:
    """End to end through backward_and_step (clipped). The norm is one f32 reduction over
    all gradients; the reference's takes per-tensor norms first, so the two agree to f32
    rounding and the weights to a few ulps."""
    policy = get_policy("f32", CPU)
    old_net, new_net, old, new = _pair(F32, 0.0, True)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(3))
    loss = new_net(x).square().mean() * 50
    result = policy.backward_and_step(loss, new, StepGuard(CPU), max_grad_norm=0.1)
    (old_net(x).square().mean() * 50).backward()
    params = list(old_net.parameters())
    norm = reference_grad_norm(params)
    old.step(ok=torch.tensor(True), grad_scale=reference_grad_scale(norm, 0.1, None))
    assert float(result.grad_norm) == pytest.approx(float(norm), rel=1e-6)
    assert float(norm) > 0.1  # the step was clipped
    for p, q in zip(params, new_net.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_a_non_finite_loss_with_finite_gradients_is_skipped() -> None:
    policy = get_policy("f32", CPU)
    w = nn.Parameter(torch.ones(3))
    opt = policy.make_optimizer([w], lr=0.1)
    guard = StepGuard(CPU)
    loss = w.sum() + torch.tensor(float("inf"))  # gradient 1, loss inf
    result = policy.backward_and_step(loss, opt, guard, max_grad_norm=1.0)
    assert not bool(result.ok) and int(guard.skipped) == 1
    assert torch.equal(w.detach(), torch.ones(3))


# --------------------------------------------------------------------------------------
# No host sync, and ops per step independent of the parameter count


class Stack(nn.Module):
    keep_f32 = ("gain",)  # an f32 island under bf16: a second dtype in the step

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(6, 6) for _ in range(depth)])
        self.head = nn.Linear(6, 1)
        self.gain = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))).float() * self.gain


def _stepper(policy_name: str, depth: int):  # type: ignore[no-untyped-def]
    policy = get_policy(policy_name, CPU)
    model = policy.convert_module(Stack(depth))
    opt = policy.make_optimizer(model.parameters(), lr=1e-3, weight_decay=0.01)
    guard, scaler = StepGuard(CPU), policy.make_scaler()
    x = policy.convert_input(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)))

    def forward() -> torch.Tensor:
        with policy.autocast():
            return model(x).square().mean()

    def step() -> None:
        policy.backward_and_step(forward(), opt, guard, 1.0, scaler)

    def forward_backward() -> None:
        forward().float().backward()

    return step, forward_backward, model


@pytest.mark.parametrize("policy_name", [p for p in POLICY_NAMES if p != "auto"])
def test_guarded_step_reads_nothing_on_the_host(
    policy_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    step, _, model = _stepper(policy_name, depth=3)
    before = [p.detach().clone() for p in model.parameters()]
    with NoHostReads():
        for _ in range(3):
            step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def _ops(fn) -> int:  # type: ignore[no-untyped-def]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )


@pytest.mark.parametrize("policy_name", ["f32", "bf16", "fp16-mixed"])
def test_optimizer_and_guard_ops_do_not_grow_with_parameter_tensors(policy_name: str) -> None:
    counts = []
    for depth in (1, 12):
        step, forward_backward, model = _stepper(policy_name, depth)
        step()  # arenas built
        model.zero_grad(set_to_none=False)
        fb = _ops(forward_backward)
        model.zero_grad(set_to_none=False)
        counts.append(_ops(step) - fb)
    assert counts[0] == counts[1], counts
    assert counts[1] <= 40, counts
