"""op.grad through the whole pipeline: trace, reverse-mode graph, rewrite, extraction, lowering,
and the numpy executor, checked against float64 finite differences of the forward function."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError, DTypeError, ResultError, ShapeError, TesseraError
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.explain_report import ExplainReport
from tessera_rw.grad_kernel import GradKernel
from tessera_rw.pipeline import CompiledProgram

RNG = np.random.default_rng(7)
EPS = 1e-6


def forward_loss(fn, args):
    """The loss as a function of every argument, on the forward graph's numpy reference."""
    graph = op.kernel(fn).trace(*args)
    return lambda values: float(evaluate(graph, dict(zip(graph.input_names, values)))[0])


def numeric_gradient(fn, args, i: int) -> np.ndarray:
    """Central differences of the loss in every element of argument i."""
    loss = forward_loss(fn, args)
    grad = np.zeros_like(args[i])
    for index in np.ndindex(args[i].shape):
        bumped = [list(args), list(args)]
        for sign, values in zip((1, -1), bumped):
            values[i] = args[i].copy()
            values[i][index] += sign * EPS
        grad[index] = (loss(bumped[0]) - loss(bumped[1])) / (2 * EPS)
    return grad


def directional_error(fn, args, argnums: tuple[int, ...], grads) -> float:
    """|∂L/∂d numeric - <grad, d>| relative to Σ|grad||d|, for one random direction per argument."""
    loss = forward_loss(fn, args)
    worst = 0.0
    for i, g in zip(argnums, grads):
        d = RNG.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + EPS * d, args[i] - EPS * d
        numeric = (loss(plus) - loss(minus)) / (2 * EPS)
        worst = max(worst, abs(numeric - float(np.sum(g * d))) / float(np.sum(np.abs(g * d))))
    return worst


def relative_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# ---- the two models the gradients must get right ---------------------------------------------------

def mlp_loss(x, w1, b1, gamma, beta, w2, b2, labels):
    """Cross-entropy of a layernorm-gelu MLP; labels are one-hot rows."""
    h = op.gelu(op.layernorm(x @ w1 + b1, gamma, beta))
    logits = h @ w2 + b2
    return -op.mean(op.sum(labels * op.log_softmax(logits, axis=-1), axis=-1))


def mlp_arrays(tokens=5, width=4, hidden=6, classes=3, dtype=np.float64):
    shapes = [(tokens, width), (width, hidden), (hidden,), (hidden,), (hidden,), (hidden, classes), (classes,)]
    arrays = [RNG.standard_normal(s).astype(dtype) for s in shapes]
    return arrays + [np.eye(classes, dtype=dtype)[RNG.integers(0, classes, tokens)]]


def attention_loss(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv
    p = op.softmax((q @ k.mT) * (q.shape[-1] ** -0.5), axis=-1)
    return op.mean((p @ v) @ wo)


def attention_arrays(batch=2, seq=5, width=6, head=4):
    shapes = [(batch, seq, width), (width, head), (width, head), (width, head), (head, width)]
    return [RNG.standard_normal(s) for s in shapes]


@pytest.mark.parametrize("fn, make_args", [(mlp_loss, mlp_arrays), (attention_loss, attention_arrays)],
                         ids=["mlp_layernorm_gelu_cross_entropy", "attention_block"])
def test_gradients_match_finite_differences_through_the_pipeline(fn, make_args):
    args = make_args()
    argnums = tuple(range(7 if fn is mlp_loss else 5))     # every parameter but the labels
    grads = op.grad(fn, argnums=argnums)(*args)
    assert len(grads) == len(argnums)
    for i, g in zip(argnums, grads):
        assert g.shape == args[i].shape and g.dtype == np.float64
        assert relative_error(g, numeric_gradient(fn, args, i)) < 1e-5, f"argument {i}"


def test_float32_gradients_agree_with_float64(monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")       # float32 would go to a GPU where there is one
    args64 = mlp_arrays()
    args32 = [a.astype(np.float32) for a in args64]
    g = op.grad(mlp_loss, argnums=(1, 5))
    for got, want in zip(g(*args32), g(*args64)):
        assert got.dtype == np.float32
        assert relative_error(got, want) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("fn, make_args, argnums", [
    (mlp_loss, lambda: mlp_arrays(tokens=64, width=32, hidden=64, classes=16), (0, 1, 2, 3, 4, 5, 6)),
    (attention_loss, lambda: attention_arrays(batch=2, seq=64, width=32, head=16), (0, 1, 2, 3, 4)),
], ids=["mlp", "attention_block"])
def test_float32_backward_graphs_on_the_gpu_agree_with_the_executor(monkeypatch, fn, make_args, argnums):
    args = [a.astype(np.float32) for a in make_args()]
    g = op.grad(fn, argnums=argnums)
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    want = g(*args)
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")
    got = g(*args)
    for a, b in zip(got, want):
        assert a.dtype == np.float32 and relative_error(a, b) < 1e-3


# ---- more ops' backward graphs through rewriting, lowering and the executor ------------------------

def conv_loss(x, w, w1):
    y = op.relu(op.conv2d(x, w, stride=2, padding=1, groups=2))
    return op.sum(op.tanh(op.conv1d(op.reshape(y, (2, 4, 16)), w1, padding="same", dilation=2)))


def spectral_loss(x, w):
    y = op.irfft(op.rfft(x, n=16) * op.rfft(w, n=16), n=16)
    return op.sum(y * y) + op.mean(op.abs(op.fft(x, norm="ortho")))


def attention_op_loss(q, k, v, mask, w):
    # w is not differentiated, so the backward graph never reads the flash_attention result
    return op.sum(op.flash_attention(q, k, v, mask=mask, causal=True, scale=0.4) * w)


def layout_loss(x, w):
    h = op.rmsnorm(op.silu(x), w)                                            # (4, 6)
    pooled = op.concatenate([op.max(h, axis=-1, keepdims=True), op.min(h[:, ::2], axis=-1, keepdims=True)], axis=-1)
    padded = op.pad(pooled, ((1, 0), (0, 2)))                                # (5, 4)
    mirrored = op.pad(h, ((2, 1), (0, 3)), mode="reflect")                   # (7, 9)
    borders = op.sum(op.pad(h, ((0, 1), (2, 2)), mode="symmetric")[:, ::3]) + op.sum(
        op.pad(h, 2, mode="wrap") * op.pad(h, 2, mode="edge"))
    return (op.sum(padded[1:, :2] * h[:, 4:]) + op.sum(op.sigmoid(h[:, 1:4]).T @ h[:, :2])
            + 0.1 * op.sum(mirrored * mirrored) + borders)


@pytest.mark.parametrize("fn, shapes, argnums", [
    (conv_loss, [(2, 4, 8, 8), (4, 2, 3, 3), (4, 4, 3)], (0, 1, 2)),
    (spectral_loss, [(3, 12), (3, 7)], (0, 1)),
    (attention_op_loss, [(2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8), (6, 6), (2, 4, 6, 8)], (0, 1, 2, 3)),
    (layout_loss, [(4, 6), (6,)], (0, 1)),
], ids=["conv", "spectral", "flash_attention_gqa_mask", "layout_and_reductions"])
def test_backward_graphs_of_other_ops_run_and_are_right(fn, shapes, argnums):
    args = [RNG.standard_normal(s) for s in shapes]
    grads = op.grad(fn, argnums=argnums)(*args)
    assert [g.shape for g in grads] == [args[i].shape for i in argnums]
    assert directional_error(fn, args, argnums, grads) < 1e-6


# ---- the kernel object ------------------------------------------------------------------------

def linear_loss(x, w, b):
    return op.mean((x @ w + b) ** 2)


def linear_arrays():
    return RNG.standard_normal((4, 3)), RNG.standard_normal((3, 2)), RNG.standard_normal(2)


def test_an_int_argnum_gives_one_array_a_tuple_gives_a_tuple():
    x, w, b = linear_arrays()
    dw = op.grad(linear_loss, argnums=1)(x, w, b)
    (db,) = op.grad(linear_loss, argnums=(2,))(x, w, b)
    y = x @ w + b
    np.testing.assert_allclose(dw, x.T @ (2 * y / y.size))
    np.testing.assert_allclose(db, (2 * y / y.size).sum(axis=0))


def test_explain_trace_and_program_describe_the_backward_graph():
    g = op.grad(linear_loss, argnums=(1, 2))
    x, w, b = linear_arrays()
    graph = g.trace(x, w, b)
    assert isinstance(graph, Graph) and graph.name == "grad_linear_loss"
    assert [o.type for o in graph.outputs] == [graph.inputs[1].type, graph.inputs[2].type]
    graph.verify()
    assert isinstance(g.program(x, w, b), CompiledProgram)
    report = g.explain(op.tensor((4, 3), "float32"), op.tensor((3, 2), "float32"), op.tensor((2,), "float32"))
    assert isinstance(report, ExplainReport) and "grad_linear_loss" in str(report)
    assert ExplainReport.from_json(report.to_json()) == report


def test_placeholders_give_the_gradients_shapes_and_dtypes():
    g = op.grad(linear_loss, argnums=(0, 1))
    dx, dw = g(op.tensor((8, 16), "bf16"), op.tensor((16, 4), "bf16"), op.tensor((4,), "bf16"))
    assert isinstance(dx, TensorSpec) and dx.shape == (8, 16) and str(dx.dtype) == "bfloat16"
    assert dw.shape == (16, 4)


def test_traces_once_per_signature():
    calls = []

    def loss(x, w):
        calls.append(x.shape)
        return op.sum(x @ w)

    g = op.grad(loss, argnums=1)
    x, w = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    g(x, w)
    g(x + 1.0, w)
    g.explain(x, w)
    assert len(calls) == 1 and len(g.graphs) == 1
    g(x.astype(np.float32), w.astype(np.float32))
    assert len(calls) == 2


def test_a_kernel_and_static_arguments():
    @op.kernel
    def scaled(x, w, scale=2.0):
        return op.sum(x @ w) * scale

    g = op.grad(scaled, argnums=1)
    assert isinstance(g, GradKernel)
    x, w = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    want = np.broadcast_to(x.sum(axis=0)[:, None], w.shape)
    np.testing.assert_allclose(g(x, w), 2.0 * want)
    np.testing.assert_allclose(g(x, w, scale=0.5), 0.5 * want)
    with pytest.raises(ArgumentError, match="'scale'.*not a tensor"):
        op.grad(scaled, argnums=2)(x, w, 3.0)


def test_an_input_the_loss_does_not_read_gets_zeros():
    g = op.grad(lambda x, unused: op.sum(op.exp(x)), argnums=(0, 1))
    x = RNG.standard_normal(3)
    dx, du = g(x, np.ones((2, 2), np.float32))
    np.testing.assert_allclose(dx, np.exp(x))
    assert du.dtype == np.float32 and not du.any()


def test_gradients_compose_inside_traced_functions():
    cube = op.grad(lambda x: op.sum(x * x * x))          # 3x²
    second = op.grad(lambda x: op.sum(cube(x)))          # 6x
    x = RNG.standard_normal(5)
    np.testing.assert_allclose(second(x), 6 * x)


def test_errors_name_the_function_and_what_to_do():
    x = RNG.standard_normal((2, 3))
    with pytest.raises(ShapeError, match=r"per_row returns f64\[2\].*not a scalar") as e:
        op.grad(_named("per_row", lambda x: op.sum(x, axis=1)))(x)
    assert "op.sum" in str(e.value) and e.value.site.startswith(f"{__file__}:")      # the line taking it
    with pytest.raises(ResultError, match="returns 2 values") as e:
        op.grad(lambda x: (op.sum(x), op.sum(x)))(x)
    assert "op.grad(lambda x: (op.sum(x), op.sum(x)))(x)" in e.value.site
    with pytest.raises(ArgumentError, match=r"argnums \[3\] out of range"):
        op.grad(linear_loss, argnums=(0, 2, 3))
    with pytest.raises(ArgumentError, match="argnums must be an int"):
        op.grad(linear_loss, argnums="w")
    with pytest.raises(DTypeError, match="'n' is i64") as e:
        op.grad(lambda x, n: op.sum(x * op.cast(n, "float64")), argnums=(0, 1))(x, np.arange(3))
    assert "leave integer and bool inputs out of argnums" in str(e.value)
    with pytest.raises(DTypeError, match="'z' is c128.*real floating-point inputs only") as e:
        op.grad(lambda z: op.sum(op.abs(z)))(np.ones(3, np.complex128))
    assert "op.rfft" in str(e.value)


def test_the_gradient_of_a_tuned_kernel_keeps_its_tuning():
    @op.autotune(cache="grad_tuning", method="cost_model", max_trials=7)
    @op.kernel
    def loss(x, w):
        return op.sum(op.relu(x @ w))

    loss.schedule.search_space(warps=[4])
    g = op.grad(loss, argnums=1)
    assert g.tuning == loss.tuning and g.tuning.cache == "grad_tuning" and g.tuning.max_trials == 7
    assert g.restriction == loss.restriction is not None
    assert op.grad(lambda x: op.sum(x)).tuning is None


def _named(name, fn):
    fn.__name__ = name
    return fn


def test_a_tie_of_maximum_or_minimum_splits_the_gradient_in_half():
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 0.0])
    for fn, wins in ((op.maximum, x > y), (op.minimum, x < y)):
        dx, dy = op.grad(lambda a, b: op.sum(fn(a, b) * 3.0), argnums=(0, 1))(x, y)
        np.testing.assert_array_equal(dx, np.where(x == y, 1.5, np.where(wins, 3.0, 0.0)))
        np.testing.assert_array_equal(dx + dy, np.full(3, 3.0))


def test_the_gradient_of_a_gradient_is_the_second_derivative():
    def f(x):
        return op.sum(op.tanh(x) * x ** 3)

    def second_derivative(x):                      # of tanh(x)·x³, analytically
        t = np.tanh(x)
        return -2 * t * (1 - t ** 2) * x ** 3 + 6 * (1 - t ** 2) * x ** 2 + 6 * t * x

    x = np.array(0.7)
    np.testing.assert_allclose(op.grad(op.grad(f))(x), second_derivative(x), rtol=1e-12)
    xs = np.array([0.3, -1.2, 2.0])                # elementwise: Σ ∂f/∂x has the diagonal as gradient
    np.testing.assert_allclose(op.grad(lambda x: op.sum(op.grad(f)(x)))(xs), second_derivative(xs), rtol=1e-12)


def test_a_gradient_whose_rules_build_constants_is_reused_by_every_trace_that_calls_it():
    """The FFT gradient builds constants; a second trace calling the cached gradient once found them
    inputs of the first trace's graph only. A convolution's gradient, differentiated again, too."""
    from tests.finite_differences import numeric_gradient
    spectrum_grad = op.grad(lambda x: op.sum(op.abs(op.rfft(x)) ** 2))
    x = np.random.default_rng(2).standard_normal(6)
    for power in (2, 3):                                 # two traces of functions calling it
        outer = op.grad(lambda x: op.sum(spectrum_grad(x) ** power))
        want = numeric_gradient(lambda x: np.sum(spectrum_grad(x) ** power), x)
        np.testing.assert_allclose(outer(x), want, rtol=1e-6, atol=1e-6)
    conv_grad = op.grad(lambda x, w: op.sum(op.conv1d(x, w) ** 2))
    x, w = np.random.default_rng(3).standard_normal((1, 1, 8)), np.random.default_rng(4).standard_normal((2, 1, 3))
    assert np.isfinite(op.kernel(lambda x, w: op.sum(conv_grad(x, w) ** 2))(x, w))
    assert op.grad(lambda x, w: op.sum(conv_grad(x, w) ** 2), 1)(x, w).shape == w.shape


def test_the_kinks_of_abs_and_pow_at_zero_give_the_usual_finite_gradients():
    np.testing.assert_array_equal(op.grad(lambda x: op.sum(op.abs(op.rfft(x))))(np.ones(4)), np.ones(4))
    np.testing.assert_array_equal(op.grad(lambda x: op.sum(x ** 0.0))(np.array([0.0, 1.0])), [0.0, 0.0])
    exponent = op.grad(lambda a, b: op.sum(a ** b), 1)
    np.testing.assert_array_equal(exponent(np.zeros(2), np.array([1.5, 2.0])), [0.0, 0.0])
    np.testing.assert_allclose(exponent(np.array([2.0]), np.array([3.0])), [8 * np.log(2.0)])
    square = op.grad(lambda a: op.sum(a ** 2.0))
    assert not {"where", "pow"} & set(square.trace(np.zeros(3)).op_counts())   # 2a: no guard, no a ** 1.0
    np.testing.assert_array_equal(square(np.array([0.0, 3.0])), [0.0, 6.0])


def test_differentiating_a_parameter_that_is_not_a_tensor_says_what_it_is():
    def loss(x, scale=None):
        return op.sum(x)
    with pytest.raises(ArgumentError, match="'scale' \\(argnum 1\\): it is left at its default, not a tensor"):
        op.grad(loss, 1)(np.ones(3))
    with pytest.raises(ArgumentError, match="it is given 2.0, not a tensor"):
        op.grad(loss, 1)(np.ones(3), 2.0)


def test_op_kernel_of_a_kernel_is_that_kernel():
    g = op.grad(lambda x, w: op.sum((x @ w) ** 2), 1)
    assert op.kernel(g) is g
    x, w = np.ones((4, 3)), np.full((3, 2), 0.5)
    np.testing.assert_allclose(op.kernel(g)(x, w), np.full((3, 2), 12.0))


def test_partials_and_callable_objects_are_kernels_named_after_their_function():
    import functools

    def loss(x, w, scale):
        return op.sum(x * w) * scale

    class Loss:
        def __call__(self, x, w):
            return op.sum(x * w)

    g = op.grad(functools.partial(loss, scale=2.0), 1)
    np.testing.assert_allclose(g(np.full(2, 3.0), np.ones(2)), np.full(2, 6.0))
    assert g.name == "grad_loss" and op.grad(Loss(), 1).name == "grad_Loss"
    np.testing.assert_allclose(op.kernel(Loss())(np.ones(2), np.full(2, 2.0)), 4.0)


def test_an_op_without_a_vjp_is_named_with_its_operands_and_the_call_site():
    import tessera_rw_rmsnorm_matmul  # noqa: F401  (the test command installs the example plugin)
    x, g, w = np.ones((4, 8), np.float32), np.ones(8, np.float32), np.ones((8, 3), np.float32)
    with pytest.raises(TesseraError, match="declares no VJP") as e:
        op.grad(lambda x, g, w: op.sum(op.apply("rmsnorm_matmul", (x, g, w), eps=1e-6)), 2)(x, g, w)
    assert "x: f32[4,8], g: f32[8], w: f32[8,3]" in str(e.value) and "test_grad.py" in str(e.value)


def test_a_gradient_of_a_method_called_on_the_class_says_how_to_bind_it():
    class Linear:
        def __init__(self):
            self.w = np.ones((3, 2))

        @op.kernel
        def loss(self, x):
            return op.sum(x @ self.w)

    with pytest.raises(ArgumentError, match=r"op\.grad\(instance\.loss\)"):
        op.grad(Linear.loss)(Linear(), np.ones((4, 3)))
    np.testing.assert_allclose(op.grad(Linear().loss)(np.ones((4, 3))), np.full((4, 3), 2.0))
