"""Kernels and gradients take dicts, lists, tuples and namedtuples of arrays (a model's parameters)
and return them: each leaf is an input named by its path, the structure is part of the signature."""

import collections
import copy

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError, ResultError

rng = np.random.default_rng(7)
State = collections.namedtuple("State", "scale shift")


def params(dtype=np.float32):
    return {"w1": rng.standard_normal((8, 16)).astype(dtype), "b1": rng.standard_normal(16).astype(dtype),
            "layers": [{"w": rng.standard_normal((16, 16)).astype(dtype) / 4} for _ in range(2)], "eps": 1e-5}


def mlp(p, x):
    h = op.tanh(x @ p["w1"] + p["b1"])
    for layer in p["layers"]:
        h = op.layernorm(h @ layer["w"], None, None, axis=-1, eps=p["eps"])
    return {"out": h, "total": op.sum(h)}


def mlp_reference(p, x):
    h = np.tanh(x @ p["w1"] + p["b1"])
    for layer in p["layers"]:
        h = h @ layer["w"]
        h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + p["eps"])
    return {"out": h, "total": h.sum()}


def test_dict_of_parameters_in_and_dict_out_match_numpy():
    p, x = params(), rng.standard_normal((4, 8)).astype(np.float32)
    got, want = op.kernel(mlp)(p, x), mlp_reference(p, x)
    assert set(got) == {"out", "total"}
    np.testing.assert_allclose(got["out"], want["out"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["total"], want["total"], rtol=1e-3, atol=1e-3)


def test_leaves_are_inputs_named_by_their_path():
    p = params()
    graph = op.kernel(mlp).trace(p, np.zeros((4, 8), np.float32))
    assert graph.input_names == ("p.w1", "p.b1", "p.layers[0].w", "p.layers[1].w", "x")
    assert "eps=1e-05" in str(graph)          # a number in the container is a constant of the trace


def test_placeholders_inside_containers_give_the_result_structure():
    spec = {"w1": op.tensor((8, 16), "bf16"), "b1": op.tensor((16,), "bf16"),
            "layers": [{"w": op.tensor((16, 16), "bf16")}], "eps": 1e-5}
    out = op.kernel(mlp)(spec, op.tensor((4, 8), "bf16"))
    assert out["out"].shape == (4, 16) and out["total"].shape == ()


def test_namedtuple_and_list_arguments_and_results():
    @op.kernel
    def affine(state, xs):
        return [state.scale * x + state.shift for x in xs], (xs[0] * 2.0,)

    s = State(rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32))
    xs = [rng.standard_normal(3).astype(np.float32) for _ in range(2)]
    ys, (doubled,) = affine(s, xs)
    assert isinstance(ys, list) and len(ys) == 2
    for x, y in zip(xs, ys):
        np.testing.assert_allclose(y, s.scale * x + s.shift, rtol=1e-6)
    np.testing.assert_allclose(doubled, xs[0] * 2)
    assert "state.scale" in affine.trace(s, xs).input_names


def test_structure_is_part_of_the_signature():
    k = op.kernel(lambda p: p["a"] * 2.0 if "b" not in p else p["a"] * p["b"])
    a = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(k({"a": a}), a * 2)
    np.testing.assert_allclose(k({"a": a, "b": a}), a * a)
    np.testing.assert_allclose(k({"a": a + 1}), (a + 1) * 2)     # the first trace again, new values
    assert len(k.graphs) == 2


def test_gradient_with_respect_to_a_dict_matches_finite_differences():
    p = params(np.float64)
    x = rng.standard_normal((4, 8))

    def loss(p, x):
        return op.mean(mlp(p, x)["out"] ** 3)

    grads = op.grad(loss)(p, x)
    assert grads["eps"] is None                  # not a tensor: no gradient there
    assert grads["layers"][1]["w"].shape == (16, 16)

    def numeric(path):
        def value(q):
            return np.mean(mlp_reference(q, x)["out"] ** 3)
        target = p
        for key in path[:-1]:
            target = target[key]
        out = np.zeros_like(target[path[-1]])
        for idx in np.ndindex(out.shape):
            hi, lo = copy.deepcopy(p), copy.deepcopy(p)
            for q, step in ((hi, 1e-6), (lo, -1e-6)):
                leaf = q
                for key in path[:-1]:
                    leaf = leaf[key]
                leaf[path[-1]][idx] += step
            out[idx] = (value(hi) - value(lo)) / 2e-6
        return out

    for path, got in ((("b1",), grads["b1"]), (("layers", 1, "w"), grads["layers"][1]["w"])):
        want = numeric(path)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), path


def test_gradient_argnums_mix_containers_and_arrays():
    p, x = params(np.float64), rng.standard_normal((4, 8))

    def loss(p, x):
        return op.sum(mlp(p, x)["out"] * x[:, :1])

    dx, dp = op.grad(loss, argnums=(1, 0))(p, x)
    assert dx.shape == x.shape and set(dp) == {"w1", "b1", "layers", "eps"}
    (only,) = op.grad(loss, argnums=(0,))(p, x)
    np.testing.assert_allclose(only["w1"], dp["w1"])


def test_a_kernel_called_inside_another_with_a_container():
    inner = op.kernel(lambda p, x: x * p["s"] + p["t"][0])

    @op.kernel
    def outer(p, x):
        return inner(p, x) * 2.0

    p = {"s": rng.standard_normal(3).astype(np.float32), "t": [rng.standard_normal(3).astype(np.float32)]}
    x = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(outer(p, x), (x * p["s"] + p["t"][0]) * 2, rtol=1e-6)
    grads = op.grad(lambda p, x: op.sum(inner(p, x) ** 2))(p, x)
    np.testing.assert_allclose(grads["s"], 2 * (x * p["s"] + p["t"][0]) * x, rtol=1e-5)


def test_a_leaf_that_is_not_a_tensor_is_named_by_its_path():
    with pytest.raises(ArgumentError, match=r"argument 'p\.layers\[0\]\.w' is not a tensor"):
        op.kernel(mlp)({"w1": np.ones((8, 16)), "b1": np.ones(16), "layers": [{"w": object()}], "eps": 1e-5},
                       np.ones((4, 8)))


def test_a_container_holding_itself_is_refused():
    loop = [np.ones(3)]
    loop.append(loop)
    with pytest.raises(ArgumentError, match="contains itself"):
        op.kernel(lambda xs: xs[0] * 2.0)(loop)


def test_a_result_holding_something_else_names_it():
    with pytest.raises(ResultError, match=r"result\.loss \(float\)"):
        op.kernel(lambda x: {"y": x * 2.0, "loss": 0.0})(np.ones(3))


def test_integer_leaves_of_a_differentiated_container_get_none():
    p = {"w": np.ones((3, 2)), "step": np.array(7, np.int32), "lr": 0.1}
    grads = op.grad(lambda p, x: op.sum(x @ p["w"]) * p["lr"])(p, np.ones((4, 3)))
    assert grads["step"] is None and grads["lr"] is None
    np.testing.assert_allclose(grads["w"], np.full((3, 2), 0.4))


def test_a_kernel_returns_a_gradient_container_with_its_none_leaves():
    def loss(p, x):
        return op.sum((p["w"] * x) ** 2) * p["lr"]
    p, x = {"w": np.ones(3), "lr": 0.5}, np.ones(3)
    step = op.kernel(lambda p, x: op.grad(loss)(p, x))
    grads = step(p, x)
    assert grads["lr"] is None
    np.testing.assert_allclose(grads["w"], np.ones(3))


def test_two_keys_that_print_alike_are_refused_not_merged():
    nan1, nan2 = float("nan"), float("nan")
    with pytest.raises(ArgumentError, match="two keys that both read 'p\\[nan\\]'"):
        op.kernel(lambda p: p[nan1] - p[nan2])({nan1: np.ones(3), nan2: np.zeros(3)})
