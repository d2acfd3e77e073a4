"""Constant folding while tracing computes what the unfolded program computes, in every dtype."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate

DTYPES = ["float32", "bf16", "float16", "float8_e4m3", "float64", "int32"]
BINARY = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q, "mul": lambda p, q: p * q,
          "maximum": op.maximum}


def _unfolded(fn, x: np.ndarray) -> np.ndarray:
    """`fn(x)` evaluated op by op by the numpy reference, nothing folded."""
    from tessera_rw.algebra.api import dispatch
    original, dispatch.folded = dispatch.folded, lambda node: node
    try:
        graph = op.kernel(fn).trace(op.tensor(x.shape, str(x.dtype)))
    finally:
        dispatch.folded = original
    return evaluate(graph, {graph.inputs[0].attr("name"): x})[0]


@pytest.mark.parametrize("dtype, fn, want", [
    ("float32", lambda x: x * ((op.full((), 1.0) + 1e-8) - 1.0), 0.0),     # f32 rounds 1 + 1e-8 to 1
    ("bf16", lambda x: x * ((op.full((), 256.0, dtype="bf16") + 1.0) - 256.0), 0.0),
    ("bf16", lambda x: x - op.full((), 257.0, dtype="bf16"), -256.0),     # bf16(257) is 256
])
def test_folding_rounds_each_step_as_the_dtype_does(dtype, fn, want):
    x = np.zeros((2, 3), dtype=np.dtype(ml_dtypes.bfloat16) if dtype == "bf16" else dtype)
    got = np.asarray(op.kernel(fn)(x), np.float64)
    np.testing.assert_array_equal(got, np.full((2, 3), want))


def test_a_gradient_seed_folds_to_a_constant():
    graph = op.grad(lambda x: op.sum(x * 3.0) * 0.5).trace(op.tensor((4, 8), "bf16"))
    [out] = graph.outputs                                   # dL/dx = 1.5 everywhere: a broadcast constant
    assert out.op == "broadcast_to" and out.args[0].op == "constant" and out.args[0].attr("value") == 1.5


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")    # 65504 · 300 in fp16/fp8
@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(DTYPES), ops=st.lists(st.sampled_from(sorted(BINARY)), min_size=1, max_size=4),
       values=st.lists(st.sampled_from([0.0, 1.0, -2.0, 0.1, 3.5, 1e-8, 300.0, 65504.0]), min_size=5, max_size=5),
       shaped=st.booleans())
def test_folded_chains_match_the_unfolded_program(dtype, ops, values, shaped):
    np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bf16" else ml_dtypes.float8_e4m3fn
                        if dtype == "float8_e4m3" else dtype)

    def fn(x):
        acc = op.full((2, 3) if shaped else (), values[0], dtype=dtype)
        for name, v in zip(ops, values[1:]):
            acc = BINARY[name](acc, v)
        return x + acc

    x = np.zeros((2, 3), np_dtype)
    got = np.asarray(op.kernel(fn)(x), np.float64)
    want = np.asarray(_unfolded(fn, x), np.float64)
    np.testing.assert_array_equal(got, want)


def test_a_python_scalar_keeps_its_compute_precision_when_folded():
    # 0.1 against a bf16 tensor acts in float32 (as a kernel's literal); folding it into 3 · 0.1 must
    # not round the 0.1 to bf16 first
    x = np.linspace(-4, 4, 12, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(3, 4)
    fn = lambda x: x * (op.full((), 3.0, dtype="bf16") * 0.1)      # noqa: E731
    np.testing.assert_array_equal(np.asarray(op.kernel(fn)(x), np.float64), np.asarray(_unfolded(fn, x), np.float64))
