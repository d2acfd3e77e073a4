"""Elementwise kernels merged after extraction (lower/elementwise_merge.py): scalar constants go
into the expression, a tensor is read once, and a producer only one kernel reads is absorbed by it;
the program computes what it did."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_constant, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_OPS, count_ops, parse_expr
from tessera_rw.lower.elementwise_merge import MERGED_INPUTS, merge_elementwise

F32 = DType.float32
UNARY = ("exp", "tanh", "neg", "abs", "sin", "sigmoid")
BINARY = ("add", "sub", "mul", "maximum", "minimum")


def fused(*args, expr):
    return make("fused_elementwise", *args, expr=expr)


def kernels(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op not in ("input", "constant")]


def test_the_gelu_derivative_is_one_kernel_that_reads_x_once():
    # written out by autodiff it reads x in five places and holds four constants: as the fusion
    # rules bound a fused node's inputs, extraction leaves it as three kernels
    kernel = op.kernel(lambda x: op.grad(lambda t: op.sum(op.gelu(t)))(x))
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    plan = kernel.program(x).plan
    assert [s.op for s in plan.steps] == ["fused_elementwise"]
    assert len(plan.steps[0].inputs) == 1
    want = special.ndtr(x.astype(np.float64)) + x * np.exp(-0.5 * x.astype(np.float64) ** 2) / np.sqrt(2 * np.pi)
    np.testing.assert_allclose(kernel(x), want, rtol=1e-5, atol=1e-6)


def test_constants_go_into_the_expression_and_a_repeated_tensor_is_read_once():
    x = make_input("x", (4, 8), F32)
    y = fused(x, make_constant(-0.5, F32), x, expr="mul(mul($0,$1),$2)")
    (merged,) = kernels(merge_elementwise(Graph("g", (x,), (y,))))
    assert merged.args == (x,) and merged.attr_map["expr"] == "mul(mul($0,-0.5:float32),$0)"


def test_a_reduction_reads_a_repeated_tensor_once_and_takes_in_a_producer_of_its_values_shape():
    x, mu = make_input("x", (4, 8), F32), make_input("mu", (4, 1), F32)
    centred = fused(x, mu, expr="sub($0,$1)")              # read by the reduction alone: taken in
    var = make("fused_reduction", centred, x, mu, expr="mul($0,sub($1,$2))", reduce="mean", axes=(1,),
               keepdims=False)
    graph = Graph("g", (x, mu), (var,))
    (merged,) = kernels(merge_elementwise(graph))
    assert merged.op == "fused_reduction" and merged.args == (x, mu)
    assert merged.attr_map["expr"] == "mul(sub($0,$1),sub($0,$1))" and merged.attr_map["reduce"] == "mean"
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((4, 8)).astype(np.float32), "mu": rng.standard_normal((4, 1)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(merge_elementwise(graph), inputs)[0], evaluate(graph, inputs)[0], rtol=1e-6)


def test_mean_and_variance_of_the_same_rows_read_them_twice_not_four_times():
    kernel = op.kernel(lambda x: (op.mean(x, axis=-1), op.var(x, axis=-1)))
    x = np.random.default_rng(2).standard_normal((64, 300)).astype(np.float32)
    plan = kernel.program(x).plan
    assert [s.op for s in plan.steps] == ["mean", "fused_reduction"]      # one mean, kept and reshaped
    assert len(plan.steps[1].inputs) == 2                                  # x and its mean, once each
    mean, var = kernel(x)
    np.testing.assert_allclose(mean, x.mean(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, x.astype(np.float64).var(-1), rtol=1e-5)


def test_a_mask_spread_from_small_inputs_is_computed_again_by_each_reader_not_read_back():
    rows, cols = make_input("rows", (64, 1), DType.int32), make_input("cols", (1, 512), DType.int32)
    x = make_input("x", (64, 512), F32)
    hit = make("eq", rows, cols)                                   # 64 x 512 from 64 + 512 values
    picked = fused(hit, x, make_constant(0.0, F32), expr="where($0,$1,$2)")
    total = make("fused_reduction", hit, x, expr="mul(cast_float32($0),$1)", reduce="sum", axes=(1,), keepdims=False)
    merged = merge_elementwise(Graph("g", (rows, cols, x), (picked, total)))
    assert "eq" not in [n.op for n in merged.nodes]                # no bool tensor of x's size written
    rng = np.random.default_rng(4)
    inputs = {"rows": rng.integers(0, 512, (64, 1)).astype(np.int32), "cols": np.arange(512, dtype=np.int32)[None],
              "x": rng.standard_normal((64, 512)).astype(np.float32)}
    for got, want in zip(evaluate(merged, inputs), evaluate(Graph("g", (rows, cols, x), (picked, total)), inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_producer_several_kernels_read_is_computed_again_by_each_where_that_reads_no_more():
    x = make_input("x", (4, 8), F32)
    shared = fused(x, expr="exp($0)")              # reading x instead reads as many bytes
    a, b = fused(shared, expr="tanh($0)"), fused(shared, x, expr="add($0,$1)")
    merged = merge_elementwise(Graph("g", (x,), (a, b)))
    assert sorted(n.attr_map["expr"] for n in kernels(merged)) == ["add(exp($0),$0)", "tanh(exp($0))"]
    inputs = {"x": np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)}
    for got, want in zip(evaluate(merged, inputs), evaluate(Graph("g", (x,), (a, b)), inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_producer_several_kernels_read_stays_where_computing_it_again_reads_more():
    x, y = make_input("x", (256, 512), F32), make_input("y", (256, 512), F32)
    shared = fused(x, y, expr="add($0,$1)")        # each reader would read two tensors of 512 KB for one
    a, b = fused(shared, expr="tanh($0)"), fused(shared, expr="exp($0)")
    merged = merge_elementwise(Graph("g", (x, y), (a, b)))
    assert sorted(n.attr_map["expr"] for n in kernels(merged)) == ["add($0,$1)", "exp($0)", "tanh($0)"]


def test_a_mask_the_other_readers_compute_again_is_taken_in_by_the_last():
    x, g = make_input("x", (64, 32), F32), make_input("g", (1, 32), F32)
    mask = make("gt", fused(x, g, expr="mul($0,$1)"), make_constant(0.0, F32))    # bool: 1 byte of x's 4
    picked = fused(mask, x, make_constant(0.0, F32), expr="where($0,$1,$2)")        # reads x anyway
    count = make("fused_reduction", mask, expr="cast_float32($0)", reduce="sum", axes=(0,), keepdims=False)
    merged = merge_elementwise(Graph("g", (x, g), (picked, count)))
    assert len(kernels(merged)) == 2 and "bool" not in str(merged)       # no mask is written
    inputs = {"x": np.random.default_rng(6).standard_normal((64, 32)).astype(np.float32),
              "g": np.random.default_rng(7).standard_normal((1, 32)).astype(np.float32)}
    for got, want in zip(evaluate(merged, inputs), evaluate(Graph("g", (x, g), (picked, count)), inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_producer_of_another_shape_is_not_absorbed():
    x, row = make_input("x", (4, 8), F32), make_input("row", (8,), F32)
    scaled_row = fused(row, expr="exp($0)")          # absorbed, it would be computed once per element
    y = fused(x, scaled_row, expr="mul($0,$1)")
    assert len(kernels(merge_elementwise(Graph("g", (x, row), (y,))))) == 2


def test_a_merge_that_would_read_too_many_tensors_stops_short():
    xs = [make_input(f"x{i}", (4, 8), F32) for i in range(MERGED_INPUTS + 2)]
    total = xs[0]
    for x in xs[1:]:
        total = fused(total, x, expr="add($0,$1)")
    graph = Graph("g", tuple(xs), (total,))
    merged = merge_elementwise(graph)
    assert len(kernels(merged)) == 2 and all(len(n.args) <= MERGED_INPUTS for n in kernels(merged))
    feeds = {f"x{i}": np.full((4, 8), float(i), np.float32) for i in range(len(xs))}
    np.testing.assert_array_equal(evaluate(merged, feeds)[0], evaluate(graph, feeds)[0])


@st.composite
def elementwise_programs(draw):
    """A random program of one-op fused nodes and plain ops over two inputs and scalar constants,
    each value read by one or more later ones."""
    x, y = make_input("x", (3, 5), F32), make_input("y", (3, 5), F32)
    values = [x, y]
    for _ in range(draw(st.integers(2, 9))):
        name = draw(st.sampled_from(UNARY + BINARY))
        pick = st.sampled_from(values)
        operands = [draw(pick)] if name in UNARY else [draw(pick), draw(
            st.one_of(pick, st.floats(-2, 2, width=32).map(lambda c: make_constant(c, F32))))]
        if draw(st.booleans()):
            values.append(fused(*operands, expr=f"{name}({','.join(f'${i}' for i in range(len(operands)))})"))
        else:
            values.append(make(name, *operands))
    outputs = (values[-1],) + ((values[-2],) if draw(st.booleans()) else ())
    return Graph("g", (x, y), outputs)


@settings(max_examples=60, deadline=None)
@given(elementwise_programs(), st.integers(0, 2**31 - 1))
def test_a_merged_program_computes_what_the_program_did(graph, seed):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((3, 5)).astype(np.float32), "y": rng.standard_normal((3, 5)).astype(np.float32)}
    merged = merge_elementwise(graph)
    assert len(kernels(merged)) <= len(kernels(graph))
    for got, want in zip(evaluate(merged, feeds), evaluate(graph, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, fn, scalar", [
    (np.float16, lambda x: op.divide(x, 70000.0), 70000.0),        # inf in float16
    (np.float16, lambda x: op.multiply(x, 1e-8), 1e-8),            # 0 in float16
    (ml_dtypes.bfloat16, lambda x: op.multiply(x, 1.006), 1.006),   # 1.0078125 in bfloat16
])
def test_a_constant_its_dtype_does_not_hold_is_computed_as_written_as_eager_calls_and_torch_do(dtype, fn, scalar):
    """A Python scalar takes the tensors' dtype for promotion but computes with its own value (as the
    reference and torch do): the plan takes it into a kernel's expression instead of a constant
    buffer of that dtype, which would hold it rounded."""
    x = (np.random.default_rng(0).standard_normal(64) * 100).astype(dtype)
    kernel = op.kernel(fn)
    assert not kernel.program(x).plan.constants
    got = kernel(x).astype(np.float32)
    assert np.array_equal(got, fn(x.astype(np.float32)).astype(dtype).astype(np.float32))
    assert np.array_equal(got, fn(x).astype(np.float32))          # the op called eagerly
    assert np.count_nonzero(got) > got.size // 2          # not divided by inf nor multiplied by 0
    with np.errstate(over="ignore"):
        assert float(np.asarray(scalar).astype(dtype)) != scalar


def test_a_constant_its_dtype_holds_stays_with_its_one_op_kernel():
    x = np.ones(8, np.float16)
    plan = op.kernel(lambda x: x * 0.5).program(x).plan
    assert [s.op for s in plan.steps] == ["mul"] and plan.constants


def test_a_reader_that_cannot_take_every_producer_in_still_takes_the_one_it_alone_reads():
    # E spreads (N, 1) and (C,) values over (N, C) and is read twice; P reads four big tensors and
    # only P * E reads it: taking both in would read more than MERGED_INPUTS tensors, P alone does not
    n = 64
    big = [make_input(f"x{i}", (n, n), F32) for i in range(5)]
    col = [make_input(f"a{i}", (n, 1), F32) for i in range(3)]
    row = [make_input(f"b{i}", (n,), F32) for i in range(2)]
    p = fused(*big[:4], expr="add(mul(exp($0),$1),mul($2,$3))")
    e = fused(col[0], row[0], col[1], row[1], col[2], expr="mul(exp(add(mul($0,$1),$2)),tanh(mul($3,$4)))")
    graph = Graph("g", tuple(big + col + row), (fused(p, e, expr="mul($0,$1)"), fused(e, big[4], expr="mul($0,$1)")))
    merged = merge_elementwise(graph)
    assert p not in merged.nodes and len(kernels(merged)) == 3     # P taken in by its one reader; E kept for it


def test_a_reduction_taking_in_a_spread_value_reads_the_value_itself():
    x, v = make_input("x", (16, 8, 4), F32), make_input("v", (1, 8, 1), F32)
    shifted = fused(x, make("broadcast_to", v, shape=(16, 8, 4)), expr="sub($0,$1)")
    total = make("fused_reduction", shifted, expr="mul($0,$0)", reduce="sum", axes=(0, 2), keepdims=True)
    graph = Graph("g", (x, v), (total, fused(shifted, expr="exp($0)")))
    merged = merge_elementwise(graph)
    assert "broadcast_to" not in [n.op for n in merged.nodes]          # no kernel spreads v over x's shape
    inputs = {"x": np.random.default_rng(8).standard_normal((16, 8, 4)).astype(np.float32),
              "v": np.random.default_rng(9).standard_normal((1, 8, 1)).astype(np.float32)}
    for got, want in zip(evaluate(merged, inputs), evaluate(graph, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_returned_16_bit_value_computed_again_is_rounded_as_the_caller_reads_it():
    x = np.full((8, 64), 300.0, np.float16)              # x·x = 90000 overflows float16: inf, then inf·0.001
    kernel = op.kernel(lambda x: (x * x, x * x * 0.001 + 1.0, x * x * 0.002 - 1.0))
    plan = kernel.program(x).plan
    assert len(plan.steps) <= 2
    assert all(np.isinf(np.asarray(r)).all() for r in kernel(x))
    if emulator.available():
        assert all(np.isinf(r).all() for r in run_plan_emulated(plan, {"x": x}))


def test_a_16_bit_value_every_reader_computes_again_is_computed_as_a_fused_chain_in_each():
    """Not returned, x·x is what a fused chain computes inside: float32 in every reader alike."""
    x = np.full((8, 64), 300.0, np.float16)
    a, b = (np.asarray(r) for r in op.kernel(lambda x: (x * x * 1e-4 + x, x * x * 1e-3))(x))
    np.testing.assert_allclose(a.astype(np.float64), 309.0, rtol=1e-3)
    np.testing.assert_allclose(b.astype(np.float64), 90.0, rtol=1e-3)


def test_computing_values_read_several_times_again_stays_within_the_ops_of_one_expression():
    """v = v·v + v, every v returned: each v read twice by the next, 3^depth ops written out."""
    def chain(x):
        values, v = [], x
        for _ in range(16):
            v = v * v + v
            values.append(v)
        return tuple(values)
    graph = op.kernel(chain).trace(op.tensor((64, 64), "f32"))
    start = time.perf_counter()
    merged = merge_elementwise(graph)
    assert time.perf_counter() - start < 5.0
    assert all(count_ops(parse_expr(n.attr_map["expr"])) <= MAX_FUSED_OPS for n in kernels(merged)
               if n.op == "fused_elementwise")


def test_an_8_bit_float_value_is_read_as_written_never_computed_again():
    """65504 stored as e4m3 is NaN (its largest is 448): NaN · 0 is NaN, as the op-by-op program says."""
    def fn(x):
        big = op.full((), 0.0, dtype="float8_e4m3") + 65504.0
        return x + big * 0.0
    x = np.zeros((2, 3), ml_dtypes.float8_e4m3fn)
    assert np.isnan(np.asarray(op.kernel(fn)(x), np.float64)).all()


def test_a_reduction_over_a_reshaped_producer_computes_it_from_its_operands_reshaped():
    """A mean over windows of relu(x·s + b) reshaped (a tiling pool, a group norm's groups) reads x
    and the per-channel s and b as views; an operand spanning part of a run of axes the reshape
    regroups, or a producer another kernel reads too, is written and read back."""
    x, s, b = make_input("x", (2, 3, 8, 6), F32), make_input("s", (1, 3, 1, 1), F32), make_input("b", (3, 1, 1), F32)
    act = fused(x, s, b, expr="relu(add(mul($0,$1),$2))")
    windows = make("reshape", act, shape=(2, 3, 2, 4, 2, 3))
    pooled = make("mean", windows, axes=(3, 5), keepdims=False)
    merged = merge_elementwise(Graph("g", (x, s, b), (pooled,)))
    assert [n.op for n in kernels(merged)] == ["reshape"] * 3 + ["fused_reduction"]
    rng = np.random.default_rng(5)
    feeds = {k: rng.standard_normal(n.shape).astype(np.float32) for k, n in zip("xsb", (x, s, b))}
    want = np.maximum(feeds["x"] * feeds["s"] + feeds["b"], 0).reshape(windows.shape).mean(axis=(3, 5))
    np.testing.assert_allclose(evaluate(merged, feeds)[0], want, rtol=1e-6)

    per_row = make_input("r", (8, 1), F32)               # rows of the plane, which (6, 48) merges with W
    spread = fused(x, per_row, expr="mul($0,$1)")
    rows = make("mean", make("reshape", spread, shape=(6, 48)), axes=(1,), keepdims=False)
    assert "fused_elementwise" in [n.op for n in kernels(merge_elementwise(Graph("g", (x, per_row), (rows,))))]
    twice = Graph("g", (x, s, b), (pooled, act))
    assert "fused_elementwise" in [n.op for n in kernels(merge_elementwise(twice))]


def test_tiny_values_are_computed_again_by_every_kernel_that_spreads_them():
    """σ = sqrt(var + eps) per channel, from a bfloat16 variance, read (reshaped to (1, C, 1, 1)) by
    two kernels over the activations: each computes it from var, and no kernel of its own writes it.
    A value read spread little wider (a (4, 8) reader of an (8,) value) keeps its kernel."""
    x, var = make_input("x", (8, 16, 6, 6), F32), make_input("var", (16,), DType.bfloat16)
    sigma = fused(make("cast", var, dtype=F32), expr="sqrt(add($0,1e-05:float32))")
    per_channel = make("reshape", sigma, shape=(1, 16, 1, 1))
    y = fused(x, per_channel, expr="div($0,$1)")
    z = fused(x, per_channel, expr="mul($0,$1)")
    graph = Graph("g", (x, var), (y, z))
    merged = merge_elementwise(graph)
    assert sorted(n.op for n in kernels(merged)) == ["fused_elementwise", "fused_elementwise", "reshape"]
    rng = np.random.default_rng(12)
    feeds = {"x": rng.standard_normal(x.shape).astype(np.float32),
             "var": rng.random(16).astype(ml_dtypes.bfloat16)}
    for got, want in zip(evaluate(merged, feeds), evaluate(graph, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    row, small = make_input("row", (8,), F32), make_input("s", (4, 8), F32)
    scaled = fused(row, expr="exp($0)")
    readers = (fused(small, scaled, expr="mul($0,$1)"), fused(small, scaled, expr="add($0,$1)"))
    narrow = Graph("g", (small, row), readers)
    assert scaled in merge_elementwise(narrow).nodes
