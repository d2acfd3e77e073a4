"""`op.value_and_grad` and `has_aux`: the loss (and what else the function returns) comes out of the
gradient's own program, computed once, beside gradients equal to op.grad's."""

import numpy as np
import pytest

from tessera_rw import op
from tests.finite_differences import numeric_gradient
from tessera_rw.algebra.errors import ResultError

rng = np.random.default_rng(11)
X, W, B = rng.standard_normal((6, 8)), rng.standard_normal((8, 4)), rng.standard_normal(4)


def loss(x, w, b):
    return op.mean(op.tanh(x @ w + b) ** 2)


def loss_with_aux(x, w, b):
    y = op.tanh(x @ w + b)
    return op.mean(y ** 2), {"activations": y, "peak": op.max(y)}


def test_value_is_the_loss_and_gradients_are_op_grads():
    value, (dw, db) = op.value_and_grad(loss, argnums=(1, 2))(X, W, B)
    np.testing.assert_allclose(value, np.mean(np.tanh(X @ W + B) ** 2), rtol=1e-12)
    want_dw, want_db = op.grad(loss, argnums=(1, 2))(X, W, B)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-12)
    np.testing.assert_allclose(db, want_db, rtol=1e-12)
    fd = numeric_gradient(lambda w: np.mean(np.tanh(X @ w + B) ** 2), W)
    assert np.abs(dw - fd).max() <= 1e-5 * np.abs(fd).max()


def test_has_aux_returns_the_auxiliary_values_beside_the_gradient():
    dw, aux = op.grad(loss_with_aux, argnums=1, has_aux=True)(X, W, B)
    y = np.tanh(X @ W + B)
    np.testing.assert_allclose(aux["activations"], y, rtol=1e-12)
    np.testing.assert_allclose(aux["peak"], y.max())
    np.testing.assert_allclose(dw, op.grad(loss, argnums=1)(X, W, B), rtol=1e-12)

    (value, aux), (dw2,) = op.value_and_grad(loss_with_aux, argnums=(1,), has_aux=True)(X, W, B)
    np.testing.assert_allclose(value, np.mean(y ** 2), rtol=1e-12)
    np.testing.assert_allclose(dw2, dw, rtol=1e-12)


def test_the_forward_is_computed_once_in_one_program():
    k = op.value_and_grad(loss, argnums=1)
    graph = k.trace(X, W, B)
    assert len(graph.outputs) == 2
    assert sum(n.op == "tanh" for n in graph.nodes) == 1       # the loss and the gradient share it


def test_the_linear_backward_still_fuses_its_bias_gradient():
    def mse(x, w, b):
        return op.sum((x @ w + b) ** 2) * 0.5
    types = op.tensor((256, 128), "bf16"), op.tensor((128, 64), "bf16"), op.tensor((64,), "bf16")
    steps = [s.op for s in op.value_and_grad(mse, argnums=(1, 2)).program(*types).plan.steps]
    reductions = [s for s in steps if s in ("sum", "fused_reduction")]
    assert "matmul_bias_grad" in steps and len(reductions) == 1          # the one reduction is the loss's


def test_has_aux_needs_a_pair_and_a_plain_gradient_one_output():
    with pytest.raises(ResultError, match=r"must return a pair \(loss, aux\)"):
        op.grad(loss, has_aux=True)(X, W, B)
    with pytest.raises(ResultError, match="has_aux=True"):
        op.grad(loss_with_aux)(X, W, B)
    with pytest.raises(ResultError, match="has_aux=True"):
        op.value_and_grad(loss_with_aux)(X, W, B)


def test_placeholders_give_the_shapes_of_value_and_gradients():
    value, dw = op.value_and_grad(loss, argnums=1)(op.tensor((6, 8), "bf16"), op.tensor((8, 4), "bf16"),
                                                    op.tensor((4,), "bf16"))
    assert value.shape == () and dw.shape == (8, 4)
