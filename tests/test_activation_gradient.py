"""Activation derivatives in GEMM epilogues, end to end: op.grad of a two-layer MLP with relu, silu,
gelu or tanh-gelu gives a plan whose gemm writing dz = (dY W2ᵀ) ∘ act'(pre) applies act' in its
epilogue (`fused: d<act>`, reading pre, or relu's h), with no elementwise pass over dh; its gradients
on the numpy executor match the float64 gradients of the unfused graph, which finite differences confirm (away
from relu's kink: the inputs are few enough that no pre-activation lies within the step of it)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from tessera_rw import op
from tessera_rw.algebra.ops.elementwise import gelu_cotangent
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.lower.lowering import lower

ACTIVATIONS = {"relu": op.relu, "silu": op.silu, "gelu": op.gelu,
               "gelu_tanh": lambda y: op.gelu(y, approximate="tanh")}
EPS = 1e-6


def mlp_loss_of(activation: str):
    act = ACTIVATIONS[activation]

    def mlp_loss(x, w1, b1, w2, dy):
        return op.sum((act(x @ w1 + b1) @ w2) * dy)
    return mlp_loss


def shapes(tokens: int, width: int, hidden: int) -> list[tuple[int, ...]]:
    return [(tokens, width), (width, hidden), (hidden,), (hidden, width), (tokens, width)]


def mlp_grad(activation: str):
    return op.grad(mlp_loss_of(activation), argnums=(0, 1, 2, 3))


@pytest.mark.parametrize("dtype", ["bf16", "float32"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_chosen_plan_applies_the_derivative_in_the_gemm_epilogue(activation, dtype):
    program = mlp_grad(activation).program(*(op.tensor(s, dtype) for s in shapes(2048, 768, 3072)))
    kernels = program.candidate.kernels
    (dz,) = [k for k in kernels if k.op.op == "gemm" and f"d{activation}" in k.fused]
    assert dz.fused == (f"d{activation}",)
    dy, w2, pre = dz.op.operands
    # dh = dy W2ᵀ reads W2 [3072, 768] in place as its transposed B
    assert dy.shape == (2048, 768) and w2.shape == (3072, 768) and pre.shape == (2048, 3072)
    assert dz.op.attr_map["trans_b"] and not dz.op.attr_map["trans_a"]
    assert "copy" not in [k.kind for k in kernels]                  # no transpose is copied
    elementwise = [k for k in kernels if k.kind == "elementwise"]
    if activation == "relu":
        # relu′ reads h = relu(pre) (h > 0 where pre > 0), which the forward gemm writes in its
        # epilogue: pre is never written and no pass computes h
        assert not elementwise and ("bias", "relu") in [k.fused for k in kernels]
    else:
        # dW2 = hᵀ dy reads h = act(pre), which the forward gemm writes beside pre (a gemm_pre_act)
        assert not elementwise
        (both,) = [k for k in kernels if k.op.op == "gemm_pre_act"]
        assert both.fused == ("bias", "pre", activation) and both.op.result.shape == (2, *pre.shape)
    assert "reduction" not in [k.kind for k in kernels]            # db1 rides in the dW1 gemm


def float64_gradients(activation: str, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The gradients of float64 inputs: no gemm kernel takes float64, so the plan runs the VJPs'
    elementwise ops unfused."""
    return mlp_grad(activation)(*(a.astype(np.float64) for a in args))


def assert_finite_differences_agree(activation: str, args: list[np.ndarray], grads) -> None:
    """A central difference of the forward loss along a random direction, per argument."""
    wide = [a.astype(np.float64) for a in args]
    loss = op.kernel(mlp_loss_of(activation))
    rng = np.random.default_rng(1)
    for i, g in enumerate(grads):
        d = rng.standard_normal(wide[i].shape)
        plus, minus = list(wide), list(wide)
        plus[i], minus[i] = wide[i] + EPS * d, wide[i] - EPS * d
        numeric = (float(loss(*plus)) - float(loss(*minus))) / (2 * EPS)
        assert abs(numeric - float(np.sum(g * d))) <= 1e-6 * float(np.sum(np.abs(g * d)))


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_gradients_match_float64_on_the_numpy_executor(activation):
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes(64, 32, 48)]
    args[1] /= np.sqrt(32)                  # pre-activations of order 1, where the activations bend
    grad = mlp_grad(activation)
    program = grad.program(*args)
    assert any(f"d{activation}" in k.fused for k in program.candidate.kernels)
    want = float64_gradients(activation, args)
    assert_finite_differences_agree(activation, args, want)
    got = run_plan_on_cpu(lower(program.candidate.graph), dict(zip(("x", "w1", "b1", "w2", "dy"), args)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def test_a_pre_activation_of_another_shape_stays_an_elementwise_product():
    """gemm's aux is the product's own shape; a broadcast one (here a row) is left to the elementwise
    kernels, with the same values."""
    rng = np.random.default_rng(2)
    x, w, z = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 24), (24,)))
    kernel = op.kernel(lambda x, w, z: gelu_cotangent(x @ w, z))
    program = kernel.program(x, w, z)
    assert not any(k.op.op == "gemm" and "dgelu" in k.fused for k in program.candidate.kernels)
    pdf = np.exp(-0.5 * z.astype(np.float64) ** 2) / np.sqrt(2 * np.pi)
    want = (x.astype(np.float64) @ w) * (ndtr(z.astype(np.float64)) + z * pdf)
    np.testing.assert_allclose(kernel(x, w, z), want, rtol=1e-5, atol=1e-5)
