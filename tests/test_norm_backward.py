"""A layer norm's or RMS norm's input gradient is one row kernel (norm_backward): the `gradient`
ruleset reads it off what reverse mode writes, its reference is the VJP's formula, and plans built
by op.grad take it, on the CPU as on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.ops.reduction import norm_input_grad
from tessera_rw.algebra.trace import trace
from tests.finite_differences import numeric_gradient

rng = np.random.default_rng(23)
NORMS = ["layernorm", "rmsnorm"]


def steps(kernel, *args):
    return [s.op for s in kernel.program(*args).plan.steps]


@pytest.fixture
def float64_rows(monkeypatch):
    """Plans as if a row kernel took float64 (none does: its statistics are kept in float), so that
    extraction picks the fused norm nodes in float64 and the numpy executor runs their references,
    the formulas these tests hold to finite differences in double."""
    from tessera_rw.codegen.templates import rowwise
    from tessera_rw.codegen.templates.cuda_scalar import SUPPORTED
    from tessera_rw.tune.cost import kernel_cost
    monkeypatch.setattr(rowwise, "ROW_DTYPES", SUPPORTED)
    kernel_cost.cache_clear()
    yield
    kernel_cost.cache_clear()


def _vjp_formula(norm, x, g, w):
    """norm_input_grad traced and evaluated in float64: the ops reverse mode writes."""
    args = {"x": x, "g": g} | ({"w": w} if w is not None else {})
    def dx(x, g, w=None):
        return norm_input_grad(g if w is None else g * w, x, norm=norm, axes=(x.ndim - 1,), eps=1e-5)[0]
    types = {name: TensorType(a.shape, DType.float64) for name, a in args.items()}
    graph = trace(dx, types, {}).graph
    return evaluate(graph, args)[0]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 64), (4, 1)])
def test_the_reference_is_the_vjps_formula(norm, weighted, shape):
    x, g = rng.standard_normal(shape), rng.standard_normal(shape)
    w = rng.standard_normal(shape[-1:]) if weighted else None
    got = OPS["norm_backward"].reference(x, g, *(() if w is None else (w,)), norm=norm, axes=(len(shape) - 1,),
                                         eps=1e-5, has_weight=weighted)
    np.testing.assert_allclose(got, _vjp_formula(norm, x, g, w), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm", NORMS)
def test_a_norms_input_gradient_is_one_row_kernel(norm):
    x, w, b, dy = (op.tensor((8192, 4096), "bf16"), op.tensor((4096,), "bf16"), op.tensor((4096,), "bf16"),
                   op.tensor((8192, 4096), "bf16"))
    fwd = getattr(op, norm)
    grad = op.grad(lambda x, w, b, dy: op.sum(fwd(x, w, b) * dy), argnums=0)
    assert steps(grad, x, w, b, dy) == ["norm_backward"]
    report = grad.explain(x, w, b, dy)
    assert [(k.kind, k.fused) for k in report.candidates[report.chosen].kernels] == [("layernorm", ("backward",))]


def test_a_layer_norms_whole_backward_reads_x_and_dy_once():
    x, w, b, dy = (op.tensor((8192, 4096), "bf16"), op.tensor((4096,), "bf16"), op.tensor((4096,), "bf16"),
                   op.tensor((8192, 4096), "bf16"))
    grad = op.grad(lambda x, w, b, dy: op.sum(op.layernorm(x, w, b) * dy), argnums=(0, 1, 2))
    report = grad.explain(x, w, b, dy)
    chosen = report.candidates[report.chosen]
    # dx with dW's and db's partial sums in one kernel, then one sum of both's 2 x 512 rows: x and
    # dy read and dx written once, 3 passes of 67 MB and 17 MB of partials (6 passes when dW read
    # the row statistics dx's kernel wrote; 9 when it recomputed them; 1,074 MB in 10 kernels
    # with dx in five ops)
    assert steps(grad, x, w, b, dy) == ["norm_backward_grads", "sum"]
    assert ("layernorm", ("backward", "weight_grad")) in [(k.kind, k.fused) for k in chosen.kernels]
    assert chosen.hbm_bytes <= 3 * 8192 * 4096 * 2 + 20 * 2**20


def test_short_rows_keep_the_weight_gradient_apart():
    """A block of norm_backward_grads walks its rows one after another, each row's block-wide sums
    waiting on its loads: rows of 128 give it too little to load between them, so dW reads the
    statistics dx's kernel wrote instead (one block per row, many rows in flight)."""
    x, w, b, dy = (op.tensor((65536, 128), "bf16"), op.tensor((128,), "bf16"), op.tensor((128,), "bf16"),
                   op.tensor((65536, 128), "bf16"))
    grad = op.grad(lambda x, w, b, dy: op.sum(op.layernorm(x, w, b) * dy), argnums=(0, 1, 2))
    assert steps(grad, x, w, b, dy) == ["norm_backward_stats", "fused_reduction", "sum"]


def test_an_rms_norms_weight_gradient_reads_the_row_statistics_its_input_gradient_wrote():
    """Rows longer than a block holds with its partial sums (norm_backward_grads.py): dW reads the
    statistics dx's kernel wrote."""
    x, w, dy = op.tensor((4, 250, 16384), "bf16"), op.tensor((16384,), "bf16"), op.tensor((4, 250, 16384), "bf16")
    grad = op.grad(lambda x, w, dy: op.sum(op.rmsnorm(x, w, None) * dy), argnums=(0, 1))
    plan = grad.program(x, w, dy).plan
    assert [s.op for s in plan.steps] == ["norm_backward_stats", "fused_reduction"]
    n = 4 * 250 * 16384
    # dW reads mean(x²) + eps, the second statistic after dx: a view, no copy, as each statistic
    # starts at a multiple of 16 elements (the 1000 rows of mean(x²) take 1008)
    assert plan.steps[1].inputs[-1].buffer == plan.steps[0].output.buffer
    assert plan.steps[1].inputs[-1].offset == (n + 1008) * 2


def test_an_rms_norms_weight_gradient_sums_the_partials_its_input_gradient_wrote():
    x, w, dy = op.tensor((4, 1024, 4096), "bf16"), op.tensor((4096,), "bf16"), op.tensor((4, 1024, 4096), "bf16")
    grad = op.grad(lambda x, w, dy: op.sum(op.rmsnorm(x, w, None) * dy), argnums=(0, 1))
    plan = grad.program(x, w, dy).plan
    assert [s.op for s in plan.steps] == ["norm_backward_grads", "sum"]
    # dW sums the 512 rows of Σ g x̂ partials right after dx: a view, no copy
    assert plan.steps[1].inputs[0].buffer == plan.steps[0].output.buffer
    assert plan.steps[1].inputs[0].offset == 4 * 1024 * 4096 * 2


@pytest.mark.parametrize("norm", NORMS)
def test_the_packed_reference_is_dx_then_the_forwards_row_statistics(norm):
    x, g, w = rng.standard_normal((6, 10)), rng.standard_normal((6, 10)), rng.standard_normal(10)
    attrs = dict(norm=norm, axes=(1,), eps=1e-5, has_weight=True)
    packed = OPS["norm_backward_stats"].reference(x, g, w, **attrs)
    dx = OPS["norm_backward"].reference(x, g, w, **attrs)
    mean = x.mean(axis=1) if norm == "layernorm" else np.zeros(6)
    var = ((x - mean[:, None]) ** 2).mean(axis=1)
    stats = (mean, var, var + 1e-5) if norm == "layernorm" else (var, var + 1e-5)
    # dx's 60 values, then each statistic's 6 rows from the next multiple of 16: 64, 80, 96
    gap = np.zeros(10)
    want = np.concatenate([dx.ravel(), np.zeros(4)] + [np.concatenate([s, gap]) for s in stats])[:-10]
    np.testing.assert_allclose(packed, want, rtol=1e-12, atol=1e-12)
    assert OPS["norm_backward_stats"].infer(*(TensorType(a.shape, DType.float64) for a in (x, g, w)),
                                            **attrs).shape == (64 + 16 * (len(stats) - 1) + 6,)


@pytest.mark.parametrize("norm", NORMS)
def test_the_grads_reference_is_dx_then_partial_sums_of_every_parts_th_row(norm):
    x, g, w = rng.standard_normal((7, 10)), rng.standard_normal((7, 10)), rng.standard_normal(10)
    attrs = dict(norm=norm, axes=(1,), eps=1e-5, has_weight=True)
    packed = OPS["norm_backward_grads"].reference(x, g, w, parts=3, **attrs)
    # dx's 70 values, then each block of partials at the next multiple of 16: 80 and 144
    assert packed.shape == OPS["norm_backward_grads"].infer(
        *(TensorType(a.shape, DType.float64) for a in (x, g, w)), parts=3, **attrs).shape == (144 + 60,)
    np.testing.assert_allclose(packed[:70], OPS["norm_backward"].reference(x, g, w, **attrs).ravel(), rtol=1e-12)
    assert not packed[70:80].any() and not packed[140:144].any()        # the gaps
    mean = x.mean(axis=1, keepdims=True) if norm == "layernorm" else 0
    xhat = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    weight, bias = packed[80:140].reshape(3, 2, 10), packed[144:].reshape(3, 2, 10)
    for p, rows in enumerate(([0, 3, 6], [1, 4], [2, 5])):       # part p: rows p, p + 3, …
        np.testing.assert_allclose(weight[p, 0], (g * xhat)[rows].sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(bias[p, 0], g[rows].sum(axis=0), rtol=1e-12)
    assert not weight[:, 1].any() and not bias[:, 1].any()       # float64 values: nothing rounded off


def test_bfloat16_partial_sums_keep_the_rounding_their_storage_drops():
    x, g, w = (rng.standard_normal(s).astype(DType.bfloat16.numpy) for s in ((64, 32), (64, 32), (32,)))
    attrs = dict(norm="layernorm", axes=(1,), eps=1e-5, has_weight=True, parts=4)
    packed = OPS["norm_backward_grads"].reference(x, g, w, **attrs).astype(DType.bfloat16.numpy)
    wide = OPS["norm_backward_grads"].reference(*(a.astype(np.float64) for a in (x, g, w)), **attrs)
    pairs = packed[64 * 32:].astype(np.float64).reshape(8, 2, 32)
    exact = wide[64 * 32:].reshape(8, 2, 32)[:, 0]
    # value + rounding is the float32 sum within bf16's rounding of the rounding: ~2^-16, not 2^-8
    assert np.abs(pairs.sum(axis=1) - exact).max() <= 2 ** -14 * np.abs(exact).max()
    assert np.abs(pairs[:, 0] - exact).max() > 2 ** -12 * np.abs(exact).max()


def test_bad_parts_are_refused_naming_the_rows():
    x, w = TensorType((6, 8), DType.float32), TensorType((8,), DType.float32)
    attrs = dict(norm="layernorm", axes=(1,), eps=1e-5, has_weight=True)
    with pytest.raises(AttributeValueError, match=r"parts must be an int in \[1, 6\].*got 7"):
        OPS["norm_backward_grads"].infer(x, x, w, parts=7, **attrs)
    with pytest.raises(AttributeValueError, match=r"got 0"):
        OPS["norm_backward_grads"].infer(x, x, w, parts=0, **attrs)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gradients_through_the_fused_node_match_finite_differences(norm, dtype, float64_rows):
    x, w, b = rng.standard_normal((6, 33)), rng.standard_normal(33), rng.standard_normal(33)
    target = rng.standard_normal((6, 33))
    fwd = getattr(op, norm)

    def loss(x, w, b):
        return op.sum(op.tanh(fwd(x, w, b)) * target)
    grad = op.grad(loss, argnums=(0, 1, 2))
    args = tuple(a.astype(dtype) for a in (x, w, b))
    # dW reads what dx's kernel wrote: the row statistics, or its own partial sums
    assert {"norm_backward_stats", "norm_backward_grads"} & set(steps(grad, *args))
    got = grad(*args)

    f, wide = op.kernel(loss), [a.astype(np.float64) for a in args]

    def numeric(i):
        return numeric_gradient(lambda v: f(*wide[:i], v, *wide[i + 1:]), wide[i])
    rtol = 1e-5 if dtype is np.float64 else 2e-3
    for i in range(3):
        want = numeric(i)
        assert np.max(np.abs(got[i] - want)) <= rtol * (1 + np.max(np.abs(want)))


@pytest.mark.parametrize("norm", NORMS)
def test_gradients_through_the_partial_sums_match_the_vjps_formulas(norm, float64_rows):
    """At 1024 rows of 4096 the plan is norm_backward_grads and one sum over its partials: dx, dW and db
    against the float64 formulas, the whole plan run on the CPU."""
    x, w, b, dy = (rng.standard_normal(s) for s in ((1024, 4096), (4096,), (4096,), (1024, 4096)))
    fwd = getattr(op, norm)
    grad = op.grad(lambda x, w, b, dy: op.sum(fwd(x, w, b, eps=1e-5) * dy), argnums=(0, 1, 2))
    assert steps(grad, x, w, b, dy)[0] == "norm_backward_grads"
    dx, dw, db = grad(x, w, b, dy)
    mean = x.mean(axis=1, keepdims=True) if norm == "layernorm" else 0
    xhat = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(dx, _vjp_formula(norm, x, dy, w), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dw, (dy * xhat).sum(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(db, dy.sum(axis=0), rtol=1e-9, atol=1e-9)


def test_a_wrong_cotangent_is_refused_naming_both_tensors():
    x, w = TensorType((4, 8), DType.float32), TensorType((8,), DType.float32)
    with pytest.raises(ShapeError, match=r"cotangent g f32\[4,9\] differs from x f32\[4,8\]"):
        OPS["norm_backward"].infer(x, TensorType((4, 9), DType.float32), w, norm="layernorm", axes=(1,), eps=1e-5,
                                   has_weight=True)


def test_a_pre_norm_blocks_input_gradient_adds_the_residual_branch_as_it_writes_dx():
    x, w, dy = op.tensor((8192, 4096), "bf16"), op.tensor((4096,), "bf16"), op.tensor((8192, 4096), "bf16")
    grad = op.grad(lambda x, w, dy: op.sum((x + op.layernorm(x, w, None) @ op.ones((4096, 4096), "bf16")) * dy))
    report = grad.explain(x, w, dy)
    kernels = [(k.kind, k.fused) for k in report.candidates[report.chosen].kernels]
    assert ("layernorm", ("backward", "residual")) in kernels and ("elementwise", ("add",)) not in kernels
    assert "add" not in steps(grad, x, w, dy)


@pytest.mark.parametrize("norm", NORMS)
def test_the_residuals_gradient_through_the_fused_node_matches_finite_differences(norm, float64_rows):
    x, w = rng.standard_normal((5, 17)), rng.standard_normal(17)
    target = rng.standard_normal((5, 17))
    fwd = getattr(op, norm)

    def loss(x):
        return op.sum(op.tanh(x + fwd(x, w, None)) * target)
    grad = op.grad(loss)
    assert "norm_backward" in steps(grad, x) and "add" not in steps(grad, x)
    np.testing.assert_allclose(grad(x), numeric_gradient(op.kernel(loss), x), rtol=1e-5, atol=1e-8)


def test_every_layer_of_a_deep_stack_packs_its_norm_backward_and_fuses_its_bias_gradients():
    """Extraction adopts each layer's packed norm backward and bias-gradient pairs, not only the
    best one per sweep: 4 pre-norm MLP blocks, every norm's backward one norm_backward_stats and
    every weight gradient carrying its bias gradient."""
    layers, width = 4, 256

    def loss(params, x):
        h = x
        for i in range(layers):
            up = op.layernorm(h, params[f"w{i}"], params[f"b{i}"]) @ params[f"u{i}"] + params[f"bu{i}"]
            h = h + op.gelu(up) @ params[f"d{i}"] + params[f"bd{i}"]
        return op.sum(h * x)
    params = {}
    for i in range(layers):
        params |= {f"w{i}": op.tensor((width,), "bf16"), f"b{i}": op.tensor((width,), "bf16"),
                   f"u{i}": op.tensor((width, 4 * width), "bf16"), f"d{i}": op.tensor((4 * width, width), "bf16"),
                   f"bu{i}": op.tensor((4 * width,), "bf16"), f"bd{i}": op.tensor((width,), "bf16")}
    program = op.grad(loss, argnums=(0,)).program(params, op.tensor((8, 512, width), "bf16"))
    ops = [s.op for s in program.plan.steps]
    # the first norm's input is x, whose gradient is not asked for: its dx is never computed
    assert ops.count("norm_backward_stats") == layers - 1 and "norm_backward" not in ops
    assert sum("bias_grad" in k.fused for k in program.candidate.kernels) == 2 * layers
