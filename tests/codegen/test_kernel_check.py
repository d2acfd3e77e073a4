"""The machinery the GPU numerics tests check kernels with, checked on the host: inputs, references on
row subsets, the tolerance, and that a wrong or unwritten element fails. The ragged-edge ops those
tests run must have a template whose kernel compiles."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw.codegen import kernel_check as kc
from tessera_rw.codegen import kernel_inputs as ki
from tests.codegen.ragged_ops import RAGGED, attention, conv1d, of, rowwise
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import MathUnit, arch_named
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.registry import templates_for

BF16, F32 = DType.bfloat16, DType.float32


def host_kernel(op: KernelOp, inputs: ki.Inputs) -> np.ndarray:
    """What a correct kernel computes: float32 arithmetic on the stored inputs, rounded to the result."""
    arrays = [a.astype(np.float32) if a.dtype.kind not in "biuc" else a for a in inputs.arrays]
    return np.asarray(OPS[op.op].reference(*arrays, **op.attr_map)).astype(op.result.dtype.numpy)


def test_tolerance_grows_with_the_reduction_and_for_narrow_types():
    assert kc.tolerance(F32) < kc.tolerance(DType.float16) < kc.tolerance(BF16)
    assert kc.tolerance(F32, 65536) > kc.tolerance(F32, 1024) > kc.tolerance(F32)
    assert kc.tolerance(F32, unit=MathUnit.TF32) == pytest.approx(kc.BASE_TOLERANCE["tf32"] + kc.ACCUMULATION)
    assert kc.tolerance(DType.complex64) == kc.tolerance(F32)
    assert kc.tolerance(F32, fast=True) == kc.tolerance(F32, unit=MathUnit.TF32)
    assert kc.tolerance(BF16, fast=True) == kc.tolerance(BF16)


def test_inputs_are_never_zero_and_their_wide_twins_hold_the_same_values():
    t = TensorType((3, 700, 999), BF16)         # more elements than the pool: values repeat, shifted
    op = of("add", t, TensorType((999,), BF16))
    inputs = ki.random_inputs(op, np.random.default_rng(1))
    x = inputs.arrays[0]
    assert x.dtype == BF16.numpy and x.shape == t.shape and np.all(x.astype(np.float32) != 0)
    np.testing.assert_array_equal(inputs.wide(0), x.astype(np.float64))
    rows = np.array([0, 5, 699])
    np.testing.assert_array_equal(inputs.wide_take(0, rows, 1), inputs.wide(0).take(rows, axis=1))


def test_domains_masks_and_integers():
    rng = np.random.default_rng(2)
    log = ki.random_inputs(of("log", TensorType((1000,), F32)), rng).arrays[0]
    assert log.min() >= 0.5
    where = ki.random_inputs(of("where", TensorType((1000,), DType.bool), TensorType((1000,), F32),
                                TensorType((), F32)), rng)
    assert 0.3 < where.arrays[0].mean() < 0.7 and where.arrays[2].shape == ()
    ints = ki.random_inputs(of("sum", TensorType((64, 64), DType.int32), axes=(0,), keepdims=False), rng).arrays[0]
    assert ints.dtype == np.int32 and np.all(ints != 0) and np.abs(ints).max() < ki.INT_RANGE


@pytest.mark.parametrize("op", [
    of("gemm", TensorType((96, 40), F32), TensorType((40, 24), F32), TensorType((24,), F32), TensorType((96, 24), F32),
       scale=0.5, activation="relu", has_bias=True, has_residual=True, accum_dtype=None, dtype=F32),
    attention(2, 3, 96, 16, F32, causal=True),
    of("flash_attention", *[TensorType((2, 3, 96, 16), F32)] * 3, TensorType((2, 1, 96, 96), F32),
       scale=0.25, causal=True, has_mask=True),
    rowwise("layernorm", 96, 50, F32),
    conv1d((6, 4, 50), (8, 4, 3), F32, (1, 1)),
    of("gemm", TensorType((3, 40, 96), F32), TensorType((24, 40), F32), TensorType((3, 96, 24), F32),
       scale=1.0, activation="none", has_bias=False, has_residual=True, accum_dtype=None, dtype=F32,
       trans_a=True, trans_b=True),
    of("reduced_normalization", TensorType((96, 50), F32), TensorType((96, 50), F32), expr="$0", norm="log_softmax",
       axes=(1,), eps=0.0, has_weight=False, has_bias=False, post="neg(mul($0,$1))", reduce="sum", keepdims=True),
], ids=["gemm-bias-residual", "attention-causal", "attention-causal-float-mask", "layernorm", "conv1d",
        "gemm-transposed-operands", "row-sums-kept"])
def test_reference_on_row_subsets_is_the_whole_reference_restricted(op, monkeypatch):
    monkeypatch.setattr(kc, "REFERENCE_WORK", 1)
    monkeypatch.setattr(kc, "MIN_ROWS", 4)
    rng = np.random.default_rng(3)
    inputs = ki.random_inputs(op, rng)
    part = kc.expected(op, inputs, rng)
    assert part.rows is not None and len(part.rows) < op.result.shape[part.axis]
    whole = OPS[op.op].reference(*[inputs.wide(i) for i in range(len(op.operands))], **op.attr_map)
    np.testing.assert_allclose(part.value, whole.take(part.rows, axis=part.axis), rtol=1e-6, atol=1e-6)
    kc.check(part, host_kernel(op, inputs), str(op))


@pytest.mark.parametrize("name", ["matmul 77x129x63 bf16", "attention S=200 D=64 causal bf16",
                                  "softmax rows of 8191 f32", "mean middle axis of 1023 f32", "transpose 333x517 bf16"])
def test_a_correct_float32_kernel_passes_and_one_wrong_element_fails(name):
    op = RAGGED[name]
    rng = np.random.default_rng(4)
    inputs = ki.random_inputs(op, rng)
    exp = kc.expected(op, inputs, rng)
    out = host_kernel(op, inputs)
    kc.check(exp, out, name)
    wrong = out.copy().reshape(-1)
    j = wrong.size // 3
    value = float(wrong[j])
    wrong[j] = value + (0.5 if exp.exact else 0.1 * (exp.scale + abs(value)))
    with pytest.raises(kc.KernelMismatchError, match=r"\b1 of \d+ checked elements") as e:
        kc.check(exp, wrong.reshape(out.shape), name)
    assert isinstance(e.value, TesseraError) and isinstance(e.value, AssertionError)


def test_an_unwritten_element_outside_the_checked_rows_fails(monkeypatch):
    monkeypatch.setattr(kc, "REFERENCE_WORK", 1)
    op = rowwise("softmax", 512, 64, BF16)
    rng = np.random.default_rng(5)
    inputs = ki.random_inputs(op, rng)
    exp = kc.expected(op, inputs, rng)
    out = host_kernel(op, inputs)
    unchecked = next(r for r in range(512) if r not in set(exp.rows.tolist()))
    out.view(np.uint16)[unchecked, 7] = 0xFFFF          # the poison a kernel failed to overwrite
    with pytest.raises(AssertionError, match=rf"NaN/inf \(first at \({unchecked}, 7\)\)"):
        kc.check(exp, out, "softmax")


def test_an_unwritten_bool_element_fails_even_where_true_is_expected():
    t = TensorType((64, 32), DType.float32)
    op = of("lt", t, t)
    rng = np.random.default_rng(6)
    inputs = ki.random_inputs(op, rng)
    exp = kc.expected(op, inputs, rng)
    out = np.asarray(exp.value).copy()
    at = tuple(int(i) for i in np.argwhere(out)[0])
    out.view(np.uint8)[at] = 0xFF                      # the poison, which numpy reads as True
    with pytest.raises(AssertionError, match="never written"):
        kc.check(exp, out, "lt")


def test_wrong_dtype_or_shape_fails():
    op = RAGGED["sum rows of 1001 f32"]
    rng = np.random.default_rng(6)
    inputs = ki.random_inputs(op, rng)
    exp = kc.expected(op, inputs, rng)
    with pytest.raises(AssertionError, match="want float32"):
        kc.check(exp, host_kernel(op, inputs).astype(np.float64), "sum")


@pytest.mark.parametrize("name", list(RAGGED))
def test_ragged_op_has_a_template_whose_kernel_compiles(name):
    op, arch = RAGGED[name], arch_named("H100-SXM")
    found = templates_for(op)
    assert found, f"no template accepts {op}"
    schedule = found[0].schedules(op, arch)[0]
    assert compile_cuda(found[0].emit(op, schedule, arch), arch.sm).spill_bytes == 0


def test_a_fused_reduction_sums_over_its_operands_broadcast_together():
    w, x = TensorType((4096,), DType.bfloat16), TensorType((8, 4096), DType.bfloat16)
    over_rows = of("fused_reduction", w, x, expr="mul($0,$1)", reduce="sum", axes=(0,), keepdims=False)
    over_columns = of("fused_reduction", w, x, expr="mul($0,$1)", reduce="sum", axes=(1,), keepdims=False)
    assert kc.reduction_length(over_rows) == 8 and kc.reduction_length(over_columns) == 4096


def _samples_checked_by_rows_or_masked() -> list:
    """Every template sample whose GPU check restricts the reference to rows, and every attention
    sample (a mask can leave a causal row no key)."""
    from tessera_rw.algebra.opdef import OpKind
    from tessera_rw.algebra.ops import opdef
    from tessera_rw.codegen.templates.registry import templates
    return [pytest.param(op, id=f"{type(t).__name__}-{i}-{op.op}") for t in templates()
            for i, op in enumerate(t.samples())
            if kc.row_plan(op) is not None or opdef(op.op).kind is OpKind.ATTENTION]


@pytest.mark.parametrize("op", _samples_checked_by_rows_or_masked())
def test_every_samples_reference_builds_and_is_finite(op):
    rng = np.random.default_rng(0)
    reference = kc.expected(op, ki.random_inputs(op, rng), rng)
    if reference.value.dtype.kind in "fc":
        assert np.isfinite(reference.value).all(), f"{op}: the reference has NaN/inf, so no kernel can match it"


def test_a_causal_attentions_bool_mask_keeps_each_querys_own_key():
    q = TensorType((1, 2, 300, 64), BF16)
    mask = TensorType((1, 1, 300, 300), DType.bool)
    op = KernelOp.of("flash_attention", (q, q, q, mask), q, scale=0.125, causal=True, has_mask=True)
    inputs = ki.random_inputs(op, np.random.default_rng(0))
    kept = inputs.arrays[3][0, 0]
    assert kept.diagonal().all() and inputs.wide(3)[0, 0].diagonal().all()
    assert 0.6 < kept.mean() < 0.9                       # the rest stays random


def test_a_causal_attentions_one_row_bool_mask_keeps_the_first_key():
    q = TensorType((1, 2, 64, 32), F32)
    op = KernelOp.of("flash_attention", (q, q, q, TensorType((64,), DType.bool)), q, scale=0.125, causal=True,
                     has_mask=True)
    inputs = ki.random_inputs(op, np.random.default_rng(1))
    assert inputs.arrays[3][0] and np.isfinite(kc.expected(op, inputs, np.random.default_rng(1)).value).all()


def test_row_sums_without_their_axis_are_checked_whole(monkeypatch):
    """[B, T, V] rows summed to [B, T]: the operands have no rows of the result's rank to cut."""
    monkeypatch.setattr(kc, "REFERENCE_WORK", 1)
    x = TensorType((6, 5, 30), F32)
    op = of("reduced_normalization", x, x, expr="$0", norm="log_softmax", axes=(2,), eps=0.0, has_weight=False,
            has_bias=False, post="mul($0,$1)", reduce="mean", keepdims=False)
    assert kc.row_plan(op) is None and kc.reduction_length(op) == 30
    rng = np.random.default_rng(4)
    inputs = ki.random_inputs(op, rng)
    kc.check(kc.expected(op, inputs, rng), host_kernel(op, inputs), str(op))


def test_a_normalizations_rows_are_its_results_and_a_norm_backwards_are_xs():
    """A fused softmax's first operand may be a broadcast scalar: its rows are the result's. The
    input gradient with its statistics has a flat result: its rows are x's."""
    f32 = DType.float32
    scalar, x, row = TensorType((), f32), TensorType((4096, 512), f32), TensorType((1, 512), f32)
    fused = KernelOp.of("fused_normalization", (scalar, x, row), x, expr="add(mul($0,$1),$2)", norm="softmax",
                        axes=(1,), eps=0.0, has_weight=False, has_bias=False, post="$0")
    attrs = dict(norm="layernorm", axes=(1,), eps=1e-5, has_weight=False)
    packed = KernelOp.of("norm_backward_stats", (x, x), OPS["norm_backward_stats"].infer(x, x, **attrs), **attrs)
    assert kc.reduction_length(fused) == 512 and kc.reduction_length(packed) == 512


def test_a_norm_backwards_partial_sums_are_compared_as_value_plus_rounding():
    """norm_backward_grads stores each partial sum as a value and its rounding: a float64 reference's
    roundings are 0, a kernel's are not, so the check adds each pair first. A wrong sum still fails."""
    x, w = TensorType((24, 64), DType.bfloat16), TensorType((64,), DType.bfloat16)
    attrs = dict(norm="layernorm", axes=(1,), eps=1e-5, has_weight=True, parts=5)
    op = KernelOp.of("norm_backward_grads", (x, x, w), OPS["norm_backward_grads"].infer(x, x, w, **attrs), **attrs)
    assert kc.reduction_length(op) == 64
    inputs = ki.random_inputs(op, np.random.default_rng(3))
    exp = kc.expected(op, inputs, np.random.default_rng(3))
    assert exp.value.shape == (24 * 64 + 2 * 5 * 64,)           # dx, then 5 folded rows each of Σ g x̂, Σ g
    # the kernel's split: the value in bf16, what that dropped in bf16
    packed = OPS["norm_backward_grads"].reference(*(a.astype(np.float32) for a in inputs.arrays), **attrs)
    n = 24 * 64
    tail = packed[n:].reshape(-1, 2, 64)
    total = tail.sum(axis=1)
    hi = total.astype(DType.bfloat16.numpy).astype(np.float32)
    split = np.concatenate([packed[:n], np.stack([hi, total - hi], axis=1).ravel()]).astype(DType.bfloat16.numpy)
    assert np.abs(split[n + 64:n + 128].astype(np.float32)).max() > 0          # the roundings are there
    kc.check(exp, split, "split")
    wrong = split.copy()
    wrong[n + 2 * 64 + 7] = wrong[n + 2 * 64 + 7] + 4     # part 1's Σ g x̂, column 7
    with pytest.raises(AssertionError, match=r"1 of 2176 checked elements.*worst at \(1607,\)"):
        kc.check(exp, wrong, "wrong")


def test_a_strided_attention_is_checked_on_query_rows_of_its_result_layout():
    from tessera_rw.codegen.templates.attention_problem import packed_qkv_attention
    op = packed_qkv_attention(2, 16, 2048, 64, DType.bfloat16, causal=True)      # result [2, 2048, 16, 64]
    rng = np.random.default_rng(0)
    inputs = ki.random_inputs(op, rng)
    exp = kc.expected(op, inputs, rng)
    assert exp.axis == 1 and 32 <= len(exp.rows) < 2048 and exp.value.shape == (2, len(exp.rows), 16, 64)
    whole = OPS["strided_attention"].reference(*(inputs.wide(i) for i in range(3)), **op.attr_map)
    kc.check(exp, whole.astype(op.result.dtype.numpy), "the whole reference")
    wrong = whole.copy()
    wrong[1, exp.rows[-1], 7, 5] += 1.0
    with pytest.raises(kc.KernelMismatchError):
        kc.check(exp, wrong.astype(op.result.dtype.numpy), "one element off")
