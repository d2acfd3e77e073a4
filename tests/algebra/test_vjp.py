"""Every op's VJP against float64 central finite differences.

`check_vjp` takes a random linear functional of the op's output, L(x) = Re Σ conj(R)·op(x), and
compares the VJP's cotangents (of the cotangent R) with L's finite differences along random
directions: one VJP graph and two function evaluations per direction, whatever the sizes.
Inputs are random (never zeros) and drawn away from kinks and poles.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tessera_rw.algebra import api
from tessera_rw.algebra.autodiff.cotangents import BeforeFusion, no_cotangents
from tessera_rw.algebra.autodiff.reverse import grad_graph
from tessera_rw.algebra.autodiff.vjp_check import VJP_TOLERANCE as TOLERANCE, normal, vjp_disagreement, vjp_graph
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError, DTypeError, ShapeError, TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import BUILTIN_OPS, OPS
from tessera_rw.algebra.trace import trace

F64, C128, BOOL, I32 = DType.float64, DType.complex128, DType.bool, DType.int32


# ---- value samplers: where an op is smooth -------------------------------------------------------

def positive(rng, shape, dtype):
    return rng.uniform(0.5, 2.0, shape).astype(dtype.numpy)


def nonzero(rng, shape, dtype):
    """Magnitudes in [0.5, 2] with random signs (or phases): away from poles and kinks."""
    x = positive(rng, shape, F64) * np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    if dtype.is_complex:
        x = x * np.exp(2j * np.pi * rng.random(shape))
    return x.astype(dtype.numpy)


def distinct(rng, shape, dtype):
    """Values at least 0.05 apart, so no max/min has a tie within finite-difference reach."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.05 + rng.uniform(0, 0.01, n) - n * 0.025).reshape(shape).astype(dtype.numpy)


def indices_within(n: int):
    """A sampler of integer indices in (-n, n)."""
    return lambda rng, shape, dtype: rng.integers(-n + 1, n, shape).astype(dtype.numpy)


# ---- the checker -------------------------------------------------------------------------------

@dataclass
class Case:
    op: str
    operands: tuple[TensorType, ...]
    attrs: dict = field(default_factory=dict)
    sample: Callable = normal            # or one sampler per operand
    name: str = ""

    def __str__(self) -> str:
        return self.name or f"{self.op}({', '.join(map(str, self.operands))})"


def t(*shape: int, dtype: DType = F64) -> TensorType:
    return TensorType(shape, dtype)


def check_vjp(op: str, operand_types, attrs=None, sample=normal, rng=None, directions: int = 2) -> float:
    return vjp_disagreement(op, operand_types, attrs, sample, rng, directions)


# ---- one or more cases for every differentiable op ----------------------------------------------

def conv(op, x, w, stride=None, padding=None, dilation=None, groups=1, **kw) -> Case:
    spatial = len(x) - 2
    return Case(op, (t(*x), t(*w)), dict(stride=stride or (1,) * spatial, padding=padding or ((0, 0),) * spatial,
                                         dilation=dilation or (1,) * spatial, groups=groups), **kw)


def pool(op, x, attrs, kernel=(3, 3), stride=(2, 2), pad=(1, 1)) -> Case:
    """A pool (or one of its gradients) over x, its values `distinct` so that no window's max is a
    tie within finite-difference reach."""
    attrs = dict(kernel=kernel, stride=stride, pad=pad, **attrs)
    pooled = OPS[op.removesuffix("_grad").removesuffix("_picked")].infer(t(*x), **attrs)
    if op == "max_pool2d_grad":
        return Case(op, (t(*x), pooled), attrs, sample=(distinct, normal))
    if op == "max_pool2d_picked":
        return Case(op, (t(*x), t(*x)), attrs, sample=(distinct, normal))
    if op == "avg_pool2d_grad":
        return Case(op, (pooled,), dict(attrs, plane=x[-2:]))
    return Case(op, (t(*x),), attrs, sample=distinct)


def norm(op, x, params, axes=(-1,), **kw) -> Case:
    axes = tuple(a % len(x) for a in axes)
    shape = tuple(x[a] for a in axes)
    return Case(op, (t(*x),) + (t(*shape),) * len(params),
                dict(axes=axes, eps=1e-5, has_weight="w" in params, has_bias="b" in params), **kw)


def attention(q, k, v, mask=None, scale=0.3, causal=False) -> Case:
    operands = (t(*q), t(*k), t(*v)) + ((mask,) if mask is not None else ())
    return Case("flash_attention", operands, dict(scale=scale, causal=causal, has_mask=mask is not None))


def spectral(op, x, n, axis=-1, norm="backward", dtype=F64) -> Case:
    return Case(op, (t(*x, dtype=dtype),), dict(n=n, axis=axis % len(x), norm=norm))


CASES = [
    Case("add", (t(3, 4), t(4))), Case("add", (t(2, 1, 4), t(3, 1))),
    Case("sub", (t(3, 4), t(3, 1))), Case("mul", (t(2, 3), t(2, 3))), Case("mul", (t(3, 1), t(1, 4))),
    Case("mul", (t(3, dtype=C128), t(3, dtype=C128))), Case("mul", (t(2, 3, dtype=C128), t(3))),
    Case("div", (t(3, 4), t(4)), sample=(normal, nonzero)),
    Case("div", (t(3, dtype=C128), t(3, dtype=C128)), sample=nonzero),
    Case("pow", (t(3, 4), t(3, 4)), sample=positive), Case("pow", (t(5), t()), sample=(positive, normal)),
    Case("maximum", (t(3, 4), t(4)), sample=distinct), Case("minimum", (t(2, 3), t(2, 3)), sample=distinct),
    Case("neg", (t(4),)), Case("neg", (t(4, dtype=C128),)),
    Case("abs", (t(3, 4),), sample=nonzero), Case("abs", (t(5, dtype=C128),), sample=nonzero),
    Case("exp", (t(3, 2),)), Case("exp", (t(3, dtype=C128),)),
    Case("log", (t(4),), sample=positive), Case("log", (t(4, dtype=C128),), sample=nonzero),
    Case("sqrt", (t(4),), sample=positive), Case("sqrt", (t(4, dtype=C128),), sample=nonzero),
    Case("rsqrt", (t(4),), sample=positive), Case("rsqrt", (t(3, dtype=C128),), sample=nonzero),
    Case("reciprocal", (t(4),), sample=nonzero), Case("reciprocal", (t(3, dtype=C128),), sample=nonzero),
    Case("tanh", (t(4),)), Case("tanh", (t(3, dtype=C128),)), Case("sin", (t(4),)), Case("sin", (t(3, dtype=C128),)),
    Case("cos", (t(4),)), Case("cos", (t(3, dtype=C128),)), Case("erf", (t(2, 3),)), Case("sigmoid", (t(2, 3),)),
    Case("relu", (t(3, 4),), sample=nonzero), Case("silu", (t(3, 4),)),
    Case("gelu", (t(3, 4),), dict(approximate="none")), Case("gelu", (t(3, 4),), dict(approximate="tanh")),
    Case("where", (t(3, 4, dtype=BOOL), t(3, 4), t(4))), Case("where", (t(4, dtype=BOOL), t(3, 1), t())),
    Case("cast", (t(3),), dict(dtype=F64)), Case("cast", (t(3),), dict(dtype=C128)),
    Case("cast", (t(2, dtype=C128),), dict(dtype=C128)),
    Case("tril", (t(2, 4, 3),), dict(k=0)), Case("triu", (t(4, 4),), dict(k=1)),
    Case("sum", (t(3, 4, 5),), dict(axes=(0, 2), keepdims=False)),
    Case("sum", (t(3, 4),), dict(axes=(1,), keepdims=True)),
    Case("sum", (t(2, 3, dtype=C128),), dict(axes=(0, 1), keepdims=False)),
    Case("mean", (t(3, 4, 5),), dict(axes=(1,), keepdims=False)),
    Case("mean", (t(3, 4),), dict(axes=(0, 1), keepdims=True)),
    Case("mean", (t(4, dtype=C128),), dict(axes=(0,), keepdims=False)),
    Case("max", (t(3, 4, 5),), dict(axes=(0, 2), keepdims=False), sample=distinct),
    Case("max", (t(3, 4),), dict(axes=(1,), keepdims=True), sample=distinct),
    Case("logsumexp", (t(3, 4, 5),), dict(axes=(1, 2), keepdims=False)),
    # indices ±[0, 7) into an axis of 5: repeats, negatives and out-of-range ones among them
    Case("take", (t(5, 3), t(2, 4, dtype=I32)), dict(axis=0), sample=(normal, indices_within(7))),
    Case("take", (t(2, 5, 3), t(6, dtype=I32)), dict(axis=1), sample=(normal, indices_within(7))),
    Case("index_add", (t(2, 4, 3), t(2, 4, dtype=I32)), dict(axis=0, size=5), sample=(normal, indices_within(7))),
    Case("logsumexp", (t(3, 4),), dict(axes=(0,), keepdims=True)),
    pool("max_pool2d", (2, 7, 6), dict(dilation=(1, 1), ceil_mode=False)),
    pool("max_pool2d", (1, 2, 6, 7), dict(dilation=(2, 1), ceil_mode=True), kernel=(2, 3), stride=(1, 2)),
    pool("max_pool2d_grad", (2, 7, 6), dict(dilation=(1, 1), ceil_mode=False)),
    pool("max_pool2d_picked", (1, 2, 6, 7), dict(dilation=(1, 2), ceil_mode=True), kernel=(2, 3), stride=(2, 1)),
    pool("avg_pool2d", (2, 7, 6), dict(ceil_mode=True, count_include_pad=False, divisor=0)),
    pool("avg_pool2d", (1, 2, 5, 6), dict(ceil_mode=False, count_include_pad=True, divisor=3), kernel=(2, 2)),
    pool("avg_pool2d_grad", (2, 7, 6), dict(ceil_mode=True, count_include_pad=True, divisor=0)),
    Case("min", (t(4, 5),), dict(axes=(0,), keepdims=False), sample=distinct),
    Case("softmax", (t(3, 5),), dict(axis=1)), Case("softmax", (t(4, 3, 2),), dict(axis=0)),
    Case("log_softmax", (t(3, 5),), dict(axis=1)), Case("log_softmax", (t(2, 4, 3),), dict(axis=1)),
    norm("layernorm", (4, 6), ""), norm("layernorm", (3, 5), "w"), norm("layernorm", (3, 5), "b"),
    norm("layernorm", (2, 3, 4), "wb", axes=(-2, -1)), norm("layernorm", (6,), "wb"),
    norm("rmsnorm", (4, 6), ""), norm("rmsnorm", (3, 5), "wb"), norm("rmsnorm", (2, 3, 4), "w", axes=(-2, -1)),
    Case("reshape", (t(3, 4),), dict(shape=(2, 6))), Case("transpose", (t(2, 3, 4),), dict(axes=(2, 0, 1))),
    Case("broadcast_to", (t(3, 1),), dict(shape=(2, 3, 4))),
    Case("slice", (t(7, 6),), dict(starts=(1, 0), stops=(6, 6), steps=(2, 1))),
    Case("slice", (t(9, 8),), dict(starts=(0, 2), stops=(9, 7), steps=(3, 2))),
    Case("slice", (t(5, dtype=C128),), dict(starts=(1,), stops=(5,), steps=(2,))),
    Case("flip", (t(4, 5),), dict(axes=(1,))), Case("flip", (t(3, 2, 4, dtype=C128),), dict(axes=(0, 2))),
    Case("pad", (t(3, 4),), dict(pads=((1, 2), (0, 3)), value=0.0)),
    Case("pad", (t(2, 3),), dict(pads=((0, 0), (2, 1)), value=1.5)),
    Case("concatenate", (t(2, 3), t(2, 1), t(2, 4)), dict(axis=1)),
    Case("concatenate", (t(1, 3), t(2, 3)), dict(axis=0)),
    Case("matmul", (t(3, 4), t(4, 5)), dict(accum_dtype=None)),
    Case("matmul", (t(2, 3, 4), t(4, 5)), dict(accum_dtype=None)),
    Case("matmul", (t(2, 1, 3, 4), t(3, 4, 2)), dict(accum_dtype=None)),
    Case("matmul", (t(4), t(2, 4, 3)), dict(accum_dtype=None)),
    Case("matmul", (t(2, 3, 4), t(4)), dict(accum_dtype=None)),
    Case("matmul", (t(4), t(4)), dict(accum_dtype=None)),
    Case("matmul", (t(2, 3, dtype=C128), t(3, 2, dtype=C128)), dict(accum_dtype=None)),
    conv("conv1d", (2, 3, 9), (4, 3, 3)),
    conv("conv1d", (2, 4, 11), (6, 2, 3), stride=(2,), padding=((1, 2),), dilation=(2,), groups=2),
    conv("conv1d", (1, 2, 5), (2, 2, 2), padding=((4, 0),), stride=(3,)),
    conv("conv2d", (2, 3, 6, 7), (4, 3, 3, 2)),
    conv("conv2d", (2, 4, 9, 8), (4, 2, 3, 3), stride=(2, 3), padding=((1, 1), (2, 0)), dilation=(1, 2), groups=2),
    conv("conv2d", (1, 3, 5, 5), (3, 1, 3, 3), padding=((1, 1), (1, 1)), groups=3),
    spectral("fft", (3, 8), 8, dtype=C128), spectral("fft", (4, 3), 6, axis=0, norm="ortho", dtype=C128),
    spectral("fft", (2, 7), 5, norm="forward", dtype=C128), spectral("fft", (2, 6), 6),
    spectral("ifft", (3, 8), 8, dtype=C128), spectral("ifft", (2, 5), 7, norm="ortho", dtype=C128),
    spectral("ifft", (5, 2), 4, axis=0, norm="forward", dtype=C128), spectral("ifft", (2, 4), 4),
    spectral("rfft", (3, 8), 8), spectral("rfft", (2, 7), 7, norm="ortho"), spectral("rfft", (2, 6), 9, norm="forward"),
    spectral("rfft", (5, 2), 3, axis=0),
    spectral("irfft", (3, 5), 8, dtype=C128), spectral("irfft", (2, 4), 7, norm="ortho", dtype=C128),
    spectral("irfft", (2, 6), 6, norm="forward", dtype=C128), spectral("irfft", (3, 2), 9, axis=0, dtype=C128),
    attention((2, 5, 4), (2, 6, 4), (2, 6, 3)),
    attention((1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3), causal=True, scale=0.7),
    attention((2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 2)),                                   # GQA
    attention((2, 2, 3, 4), (1, 1, 5, 4), (2, 1, 5, 4)),                                   # broadcast K/V
    attention((2, 2, 4, 3), (2, 2, 6, 3), (2, 2, 6, 3), mask=t(4, 6)),                     # additive mask
    attention((2, 3, 4), (2, 5, 4), (2, 5, 4), mask=t(2, 3, 5, dtype=BOOL), causal=True),  # bool mask
]


def fused_ops() -> list[str]:
    return sorted(n for n in BUILTIN_OPS if isinstance(OPS[n].vjp, BeforeFusion))


def differentiable_ops() -> list[str]:
    """Ops whose VJP passes cotangents back (not the ones that have none, nor fused ops)."""
    return sorted(n for n in BUILTIN_OPS if OPS[n].vjp is not no_cotangents and n not in fused_ops())


@pytest.mark.parametrize("case", CASES, ids=str)
def test_vjp_matches_finite_differences(case: Case):
    rng = np.random.default_rng(zlib.crc32(str(case).encode()))
    if case.op == "flash_attention" and case.attrs["has_mask"] and case.operands[3].dtype is BOOL:
        # every row keeps its diagonal, so no row is fully masked (which would be NaN)
        mask = normal(rng, case.operands[3].shape, BOOL) | np.eye(3, 5, dtype=bool)
        case = Case(case.op, case.operands, case.attrs, sample=(normal, normal, normal, lambda *_: mask))
    assert check_vjp(case.op, case.operands, case.attrs, case.sample, rng) < TOLERANCE


def test_every_op_declares_a_vjp_and_every_differentiable_one_is_checked():
    assert [n for n in BUILTIN_OPS if OPS[n].vjp is None] == []
    checked = {c.op for c in CASES}
    assert [n for n in differentiable_ops() if n not in checked] == []


def test_fused_ops_ask_to_differentiate_before_fusion():
    assert {"gemm", "fused_elementwise", "fused_normalization", "spectral_contract"} <= set(fused_ops())
    for op in fused_ops():
        with pytest.raises(TesseraError, match=f"(?s){op}: is a fused op.*write fn with the plain ops"):
            OPS[op].vjp(None, None)


# ---- broadcasting and reductions over random shapes -----------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
       op=st.sampled_from(["add", "sub", "mul", "div", "maximum"]))
def test_binary_vjps_sum_over_broadcast_axes(shapes, op):
    a, b = shapes.input_shapes
    sample = {"div": (normal, nonzero), "maximum": distinct}.get(op, normal)
    assert check_vjp(op, (t(*a), t(*b)), {}, sample) < TOLERANCE


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(),
       op=st.sampled_from(["sum", "mean", "max", "min"]), keepdims=st.booleans())
def test_reduction_vjps_over_any_axes(shape, data, op, keepdims):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    sample = distinct if op in ("max", "min") else normal
    assert check_vjp(op, (t(*shape),), dict(axes=axes, keepdims=keepdims), sample) < TOLERANCE


@settings(max_examples=30, deadline=None)
@given(kernel=st.integers(1, 4), stride=st.integers(1, 3), dilation=st.integers(1, 3), groups=st.sampled_from([1, 2]),
       pads=st.tuples(st.integers(0, 4), st.integers(0, 4)), extra=st.integers(0, 5))
def test_conv1d_vjps_over_strides_paddings_dilations_and_groups(kernel, stride, dilation, groups, pads, extra):
    length = max(1, dilation * (kernel - 1) + 1 - sum(pads)) + extra     # at least one output
    case = conv("conv1d", (2, 2 * groups, length), (2 * groups, 2, kernel), stride=(stride,), padding=(pads,),
                dilation=(dilation,), groups=groups)
    assert check_vjp(case.op, case.operands, case.attrs) < TOLERANCE


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), data=st.data())
def test_slice_vjps_over_any_bounds_and_steps(shape, data):
    starts, stops, steps = [], [], []
    for d in shape:
        start = data.draw(st.integers(0, d - 1))
        starts.append(start)
        stops.append(data.draw(st.integers(start + 1, d)))
        steps.append(data.draw(st.integers(1, 3)))
    attrs = dict(starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    assert check_vjp("slice", (t(*shape),), attrs) < TOLERANCE


def test_max_shares_the_cotangent_among_ties():
    graph, _ = vjp_graph("max", (t(2, 3),), dict(axes=(1,), keepdims=False))
    (ct,) = evaluate(graph, {"x0": np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]), "g": np.array([1.0, 4.0])})
    np.testing.assert_array_equal(ct, [[0.0, 0.5, 0.5], [4.0, 0.0, 0.0]])


def test_a_16_bit_max_of_a_computed_value_sends_its_gradient_to_the_maximum():
    """max(x·s) in bf16: the backward compares x·s, which its kernel computes wide, with the max as
    stored (rounded): x·s is rounded first, so the maximum is found (not 0/0 for every element)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 8, 6)).astype(ml_dtypes.bfloat16)
    s = (rng.random((1, 4, 1, 1)) + 0.5).astype(ml_dtypes.bfloat16)
    from tessera_rw import op as ops
    dx = np.asarray(ops.grad(lambda x, s: ops.max(x * s))(x, s), np.float64)
    product = (x.astype(np.float32) * s.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float64)
    hit = product == product.max()
    want = np.where(hit, np.broadcast_to(s.astype(np.float64), x.shape), 0) / hit.sum()
    np.testing.assert_allclose(dx, want, rtol=1e-2)


def test_no_gradient_flows_through_stop_gradient_and_no_kernel_computes_it():
    from tessera_rw import op as ops
    x = np.array([1.0, -2.0, 3.0])
    np.testing.assert_array_equal(ops.grad(lambda x: ops.sum(x * ops.stop_gradient(x)))(x), x)
    np.testing.assert_array_equal(ops.stop_gradient(x), x)
    plan = ops.kernel(lambda x: ops.stop_gradient(x) * 2.0).program(x).plan
    assert [s.op for s in plan.steps] == ["mul"]


def test_relu_and_abs_pass_nothing_at_zero():
    for op, want in (("relu", [0.0, 0.0, 1.0]), ("abs", [-1.0, 0.0, 1.0])):
        graph, _ = vjp_graph(op, (t(3),), {})
        (ct,) = evaluate(graph, {"x0": np.array([-1.0, 0.0, 2.0]), "g": np.ones(3)})
        np.testing.assert_array_equal(ct, want)


def test_vjp_cotangents_keep_low_precision_operand_dtypes():
    graph, _ = vjp_graph("mul", (t(3, 4, dtype=DType.bfloat16), t(4, dtype=DType.float32)), {})
    assert [o.type for o in graph.outputs] == [t(3, 4, dtype=DType.bfloat16), t(4, dtype=DType.float32)]


# ---- grad_graph: the reverse walk ---------------------------------------------------------------

def traced(fn, *types: TensorType) -> Graph:
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    return trace(fn, dict(zip(names, types)), {}, name="loss").graph


def test_cotangents_of_a_value_used_twice_add_up():
    graph = grad_graph(traced(lambda x: api.sum(x * api.exp(x)), t(3)), (0,))
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(evaluate(graph, {"x": x})[0], np.exp(x) * (1 + x))


def test_branches_without_the_requested_inputs_are_not_differentiated():
    def loss(x, w):
        return api.sum(api.tanh(w) * 2.0) + api.sum(x @ w)
    graph = grad_graph(traced(loss, t(2, 3), t(3, 4)), (0,))
    assert "tanh" not in graph.op_counts()               # tanh(w) depends on w alone
    (dx,) = evaluate(graph, {"x": np.ones((2, 3)), "w": np.arange(12.0).reshape(3, 4)})
    np.testing.assert_allclose(dx, np.broadcast_to(np.arange(12.0).reshape(3, 4).sum(axis=1), (2, 3)))


def test_gradients_have_their_inputs_types_and_unused_inputs_get_zeros():
    graph = grad_graph(traced(lambda x, y, z: api.sum(x * 2.0), t(2, dtype=DType.float32), t(3), t(1, 1)), (0, 1, 2))
    assert [o.type for o in graph.outputs] == [i.type for i in graph.inputs]
    assert graph.inputs == graph.verify().inputs
    dx, dy, dz = evaluate(graph, {"x": np.ones(2, np.float32), "y": np.ones(3), "z": np.ones((1, 1))})
    np.testing.assert_array_equal(dx, [2.0, 2.0])
    assert not dy.any() and not dz.any()


def test_a_size_one_output_counts_as_a_scalar():
    graph = grad_graph(traced(lambda x: api.sum(x * x, axis=0, keepdims=True), t(3, 1)), (0,))
    np.testing.assert_allclose(evaluate(graph, {"x": np.array([[1.0], [2.0], [3.0]])})[0], [[2.0], [4.0], [6.0]])


def test_grad_graph_errors_name_the_function_and_the_problem():
    with pytest.raises(ShapeError, match=r"(?s)loss returns f64\[2\], of shape \(2,\), not a scalar.*op.sum"):
        grad_graph(traced(lambda x: api.sum(x, axis=1), t(2, 3)), (0,))
    with pytest.raises(ArgumentError, match=r"input 2: it has 2 tensor input\(s\) \['x', 'n'\]"):
        grad_graph(traced(lambda x, n: api.sum(x), t(2), t(2, dtype=DType.int64)), (2,))
    with pytest.raises(DTypeError, match=r"input 'n' is i64\[2\]"):
        grad_graph(traced(lambda x, n: api.sum(x), t(2), t(2, dtype=DType.int64)), (1,))
    with pytest.raises(DTypeError, match="real floating-point loss"):
        grad_graph(traced(lambda x: api.sum(api.fft(x)), t(4)), (0,))
