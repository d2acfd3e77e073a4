"""A strided convolution's input gradient by phases (ops/conv.py _phased_input_cotangent): one
stride-1 correlation per phase of the input, with the kernel's taps of that phase read where they
lie, then one kernel weaving them; the plan does the forward's multiply-adds (not the stride² times as many of
correlating a zero-spread g) and copies no g; on the numpy executor and in the CPU emulator
against a float64 transposed convolution written out tap by tap."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated


def transposed_conv(g, w, x_shape, stride, padding):
    """dx of conv2d(x, w; stride, padding) for the cotangent g, one kernel tap at a time (float64)."""
    (sh, sw), (ph, pw) = stride, padding
    n, c, h, wd = x_shape
    _, _, oh, ow = g.shape
    dx = np.zeros((n, c, h + 2 * ph + sh, wd + 2 * pw + sw))
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            dx[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw] += np.einsum("nopq,oc->ncpq", g, w[:, :, i, j])
    return dx[:, :, ph:ph + h, pw:pw + wd]


def _grad(stride, padding):
    return op.grad(lambda x, w, t: op.sum(op.conv2d(x, w, stride=stride, padding=padding) * t), argnums=0)


def test_the_input_gradient_does_the_forward_s_multiply_adds_and_copies_no_cotangent():
    grad = _grad(2, 1)
    x, w = op.tensor((32, 64, 56, 56), "bf16"), op.tensor((128, 64, 3, 3), "bf16")
    plan = grad.program(x, w, op.tensor((32, 128, 28, 28), "bf16")).plan
    convolutions = [s for s in plan.steps if OPS[s.op].kind.name == "CONV"]
    forward = 2 * 32 * 128 * 28 * 28 * 64 * 9
    flops = sum(OPS[s.op].flops(s.node.type, *(a.type for a in s.node.args), **s.node.attr_map)
                for s in convolutions)
    assert flops == forward
    assert not [s.op for s in plan.steps if s.op in ("pad", "concatenate")]
    # each phase reads its taps of the kernel where they lie (every other one: the kernel stays in L2)
    assert not [s.op for s in plan.steps if s.op in ("slice", "flip", "transpose")]
    assert [s.op for s in plan.steps].count("strided_conv") >= 4
    g_sized = [s.op for s in plan.steps if s.node.type.numel == 32 * 128 * 28 * 28 and s.op != "fused_elementwise"]
    assert not g_sized                                       # no copy of g (nor of the product with t)


CASES = [((2, 3, 11, 10), (4, 3, 3, 3), (2, 2), (1, 1)),      # odd height: the phases rounded up
         ((2, 4, 8, 8), (6, 4, 1, 1), (2, 2), (0, 0)),        # a 1×1 kernel: three phases no tap reaches
         ((1, 2, 9, 7), (3, 2, 2, 3), (3, 2), (1, 0)),        # stride 3 over 2 taps, uneven strides
         ((2, 2, 6, 6), (2, 2, 1, 2), (2, 2), (1, 1))]        # padding wider than the kernel's reach


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CASES)
def test_the_phased_gradient_is_the_transposed_convolution(x_shape, w_shape, stride, padding):
    rng = np.random.default_rng(14)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y = np.asarray(op.conv2d(x, w, stride=stride, padding=padding))
    t = rng.standard_normal(y.shape)
    want = transposed_conv(t, w, x_shape, stride, padding)
    np.testing.assert_allclose(_grad(stride, padding)(x, w, t), want, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_the_phased_gradient_plan_runs_its_kernels_in_the_emulator(dtype):
    x_shape, w_shape, stride, padding = CASES[0]
    rng = np.random.default_rng(15)
    x, w = rng.standard_normal(x_shape).astype(dtype), (rng.standard_normal(w_shape) * 0.3).astype(dtype)
    t = rng.standard_normal((2, 4, 6, 5)).astype(dtype)
    plan = _grad(stride, padding).program(x, w, t).plan
    (got,) = run_plan_emulated(plan, {"x": x, "w": w, "t": t})
    want = transposed_conv(t.astype(np.float64), w.astype(np.float64), x_shape, stride, padding)
    tol = 1e-5 if dtype is np.float32 else 3e-2
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())


def test_the_weight_gradient_computes_the_kernel_s_taps_alone():
    """A stride-2 7×7 convolution over 224 (padding 3) leaves the padded input's last column unread:
    its weight gradient's correlation is trimmed to 7 taps, not computed at 8 and cut (no copy)."""
    grad = op.grad(lambda x, w, t: op.sum(op.conv2d(x, w, stride=2, padding=3) * t), argnums=1)
    plan = grad.program(op.tensor((8, 3, 224, 224), "bf16"), op.tensor((64, 3, 7, 7), "bf16"),
                        op.tensor((8, 64, 112, 112), "bf16")).plan
    assert [s.op for s in plan.steps] == ["strided_conv"], plan
    rng = np.random.default_rng(16)
    x, w = rng.standard_normal((2, 3, 15, 14)), rng.standard_normal((4, 3, 7, 7))
    t = rng.standard_normal(np.asarray(op.conv2d(x, w, stride=2, padding=3)).shape)
    want = np.zeros_like(w)
    padded = np.pad(x, ((0, 0), (0, 0), (3, 3), (3, 3)))
    for i in range(7):
        for j in range(7):
            patch = padded[:, :, i:i + 2 * t.shape[2]:2, j:j + 2 * t.shape[3]:2]
            want[:, :, i, j] = np.einsum("nopq,ncpq->oc", t, patch)
    np.testing.assert_allclose(op.grad(lambda x, w, t: op.sum(op.conv2d(x, w, stride=2, padding=3) * t),
                                       argnums=1)(x, w, t), want, rtol=1e-10, atol=1e-10)
