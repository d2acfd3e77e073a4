"""@op.kernel: one trace per (shapes, dtypes) signature, placeholders, keyword arguments, inlining."""

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.tensor import TensorSpec

RNG = np.random.default_rng(1)


def counting_kernel():
    calls = []

    @op.kernel
    def f(x, w, *, scale=1.0):
        calls.append(x.shape)
        return op.relu(x @ w) * scale

    return f, calls


def test_traces_once_per_signature_and_retraces_on_a_new_one():
    f, calls = counting_kernel()
    x, w = RNG.standard_normal((4, 8)).astype(np.float32), RNG.standard_normal((8, 3)).astype(np.float32)
    f(x, w)
    f(x + 1, w)
    assert len(calls) == 1 and len(f.graphs) == 1
    f(x.astype(np.float64), w.astype(np.float64))          # new dtypes
    f(RNG.standard_normal((5, 8)).astype(np.float32), w)    # new shape
    assert len(calls) == 3 and len(f.graphs) == 3


def test_static_scalars_are_part_of_the_signature():
    f, calls = counting_kernel()
    x, w = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
    np.testing.assert_allclose(f(x, w, scale=3.0), np.full((2, 2), 6.0))
    np.testing.assert_allclose(f(x, w, scale=0.5), np.full((2, 2), 1.0))
    assert len(calls) == 2


def test_static_floats_are_keyed_by_their_bits():
    f, calls = counting_kernel()
    x, w = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
    for scale in (0.0, -0.0, float("nan"), float("nan"), 0.0):
        f(x, w, scale=scale)
    assert len(calls) == 3          # -0.0 traces apart from 0.0; a NaN finds its own trace again


def test_positional_and_keyword_arguments_give_the_same_graph():
    f, _ = counting_kernel()
    x, w = op.tensor((4, 8), "bf16"), op.tensor((8, 3), "bf16")
    assert f.trace(x, w) is f.trace(w=w, x=x)


def test_placeholders_give_placeholders_and_graphs_without_data():
    f, _ = counting_kernel()
    out = f(op.tensor((4, 16, 64), "bf16"), op.tensor((64, 32), "bf16"))
    assert isinstance(out, TensorSpec) and out.shape == (4, 16, 32) and str(out.dtype) == "bfloat16"
    graph = f.trace(op.tensor((4, 16, 64), "bf16"), op.tensor((64, 32), "bf16"))
    assert graph.input_names == ("x", "w") and graph.outputs[0].shape == (4, 16, 32)


def test_placeholders_mix_with_arrays():
    f, _ = counting_kernel()
    out = f(op.tensor((4, 8), "float32"), np.ones((8, 3), np.float32))
    assert out.shape == (4, 3)


def test_structurally_equal_expressions_are_one_node():
    @op.kernel
    def f(x):
        a = op.exp(x) + 1.0
        b = op.exp(x) + 1.0
        return a * b

    g = f.trace(op.tensor((3,), "float32"))
    mul = g.outputs[0]
    assert mul.args[0] is mul.args[1]
    assert g.op_counts() == {"exp": 1, "add": 1, "mul": 1}


def test_tuple_and_list_results_keep_their_structure():
    @op.kernel
    def f(x):
        return x + 1, x * 2

    @op.kernel
    def g(x):
        return [x - 1]

    a, b = f(np.ones(2, np.float32))
    assert isinstance(f(np.ones(2, np.float32)), tuple)
    np.testing.assert_allclose(b, [2, 2])
    assert isinstance(g(np.ones(2, np.float32)), list)


def test_kernels_inline_into_other_kernels():
    @op.kernel
    def inner(x):
        return op.tanh(x)

    @op.kernel
    def outer(x):
        return inner(x) * 2.0

    g = outer.trace(op.tensor((3,), "float32"))
    assert g.op_counts() == {"tanh": 1, "mul": 1}
    x = RNG.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(outer(x), np.tanh(x) * 2, rtol=1e-6)


def test_creation_ops_inside_a_trace_build_nodes():
    @op.kernel
    def f(x):
        n = x.shape[-1]
        return op.where(op.tril(op.ones((n, n), "bool")), x, 0.0) + op.arange(n, dtype="float32")

    x = RNG.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(f(x), np.where(np.tril(np.ones((4, 4), bool)), x, np.float32(0)) + np.arange(4, dtype=np.float32))


def test_scalars_keep_the_tensor_dtype():
    @op.kernel
    def f(x):
        return x * 0.5 / np.sqrt(4.0) + 1

    assert str(f(op.tensor((2,), "bf16")).dtype) == "bfloat16"


def test_variadic_functions_are_refused_with_a_reason():
    with pytest.raises(ArgumentError, match="named parameters"):
        op.kernel(lambda *xs: xs[0])


def test_graph_prints_like_source():
    @op.kernel
    def attention(q, k, v):
        s = (q @ k.mT) * 0.125
        return op.softmax(s, axis=-1) @ v

    t = op.tensor((2, 8, 16), "float32")
    text = str(attention.trace(t, t, t))
    assert text.splitlines()[0] == "def attention(q: f32[2,8,16], k: f32[2,8,16], v: f32[2,8,16]):"
    assert "q @ t0" in text and "t1 * 0.125" in text and "softmax(t2, axis=2)" in text
    assert text.splitlines()[-1] == "    return t4"


def test_a_float_argument_that_keeps_changing_says_how_to_make_it_an_input():
    from tessera_rw import RetraceWarning
    from tessera_rw.kernel import RETRACE_WARNING_AFTER

    @op.kernel
    def step(x, lr):
        return x * lr
    x = np.ones(3, np.float32)
    with pytest.warns(RetraceWarning, match=r"argument 'lr' has taken \d+ float values.*np\.asarray\(lr") as w:
        for i in range(RETRACE_WARNING_AFTER):
            step(x, 0.5 + i)
    assert w[0].filename == __file__                    # it points at the caller's line
    before = len(step.graphs)
    for lr in (0.25, 0.75):                             # a 0-d array is an input: one trace for every value
        np.testing.assert_allclose(step(x, np.asarray(lr, np.float32)), x * lr)
    assert len(step.graphs) == before + 1


def test_a_variadic_kernel_is_refused_naming_its_stars():
    from tessera_rw import ArgumentError
    with pytest.raises(ArgumentError, match=r"takes \*\*options"):
        op.kernel(lambda x, **options: x)
    with pytest.raises(ArgumentError, match=r"takes \*rest"):
        op.kernel(lambda x, *rest: x)


def test_eval_of_a_placeholder_says_it_has_no_data_and_what_to_do():
    from tessera_rw import ArgumentError
    y = op.softmax(op.matmul(op.tensor((8, 8)), op.tensor((8, 8))), axis=-1)
    with pytest.raises(ArgumentError, match="eval.. of a placeholder op.tensor..8, 8., 'float32'.: it has no data") as e:
        y.eval()
    assert "call the ops on arrays" in e.value.hint


def test_the_decorator_takes_parentheses_and_refuses_options_it_does_not_have():
    @op.kernel()
    def doubled(x):
        return x * 2
    np.testing.assert_array_equal(doubled(np.ones(3, np.float32)), np.full(3, 2, np.float32))
    with pytest.raises(ArgumentError, match="op.kernel takes no options \\(given mode\\)") as e:
        op.kernel(mode="max-autotune")
    assert "@op.autotune" in e.value.hint
    with pytest.raises(ArgumentError, match="takes the function to trace, not a int"):
        op.kernel(3)


def test_a_scalar_made_by_full_is_the_constant_a_python_number_would_be():
    """op.zeros((), q.dtype) in a mask reads like the literal 0 the rules know, rounded to its dtype."""
    graph = op.kernel(lambda x: x * op.full((), 0.1, "bf16") + op.zeros((), x.dtype)).trace(op.tensor((4,), "bf16"))
    assert "full" not in graph.op_counts()
    x = np.linspace(-2, 2, 4).astype("bfloat16")
    np.testing.assert_array_equal(op.kernel(lambda x: x * op.full((), 0.1, "bf16"))(x),
                                  (x.astype(np.float32) * np.float32(np.asarray(0.1, "bfloat16"))).astype("bfloat16"))
