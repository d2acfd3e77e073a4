"""When a kernel traces again: captured arrays are inputs read at each call, a global, closure or
`self` name holding another array or number traces again (the function's own, or a helper's it
calls), and ever new values or shapes warn."""

import warnings

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError, RetraceWarning
from tessera_rw.kernel import RETRACE_WARNING_AFTER

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((4, 4)).astype(np.float32)
SCALE = 1.5


@op.kernel
def project(x):
    return x @ W * SCALE


def test_a_captured_array_is_an_input_named_after_its_global():
    graph = project.trace(X)
    assert [n.attr("name") for n in graph.inputs] == ["x", "W"]
    assert "literal" not in graph.op_counts()
    assert [i.name for i in project.explain(X).inputs] == ["x", "W"]


def test_an_in_place_update_of_a_captured_array_is_seen_without_retracing():
    global W
    saved = W.copy()
    try:
        np.testing.assert_allclose(project(X), X @ W * SCALE, rtol=1e-5)
        W -= 0.5 * np.ones_like(W)                      # an optimizer step in place
        np.testing.assert_allclose(project(X), X @ W * SCALE, rtol=1e-5)
        assert len(project.graphs) == 1
    finally:
        W[...] = saved


def test_rebinding_a_global_array_or_number_traces_again():
    global W, SCALE
    saved = W, SCALE
    try:
        project(X)
        W = RNG.standard_normal((4, 4)).astype(np.float32)
        np.testing.assert_allclose(project(X), X @ W * SCALE, rtol=1e-5)
        SCALE = -2.0
        np.testing.assert_allclose(project(X), X @ W * SCALE, rtol=1e-5)
    finally:
        W, SCALE = saved


def _scaled(x):
    return x * SCALE


def _projected(x):
    return _scaled(x) @ W


def test_the_globals_of_helpers_it_calls_are_guarded_and_their_arrays_named():
    global SCALE, W
    saved = W, SCALE
    helper = op.kernel(lambda x: _projected(x))
    try:
        np.testing.assert_allclose(helper(X), X * SCALE @ W, rtol=1e-5)
        assert [n.attr("name") for n in helper.trace(X).inputs] == ["x", "W"]
        SCALE = 4.0                                   # read two calls deep
        np.testing.assert_allclose(helper(X), X * 4.0 @ W, rtol=1e-5)
        W = RNG.standard_normal((4, 4)).astype(np.float32)
        np.testing.assert_allclose(helper(X), X * 4.0 @ W, rtol=1e-5)
    finally:
        W, SCALE = saved


def test_closures_and_module_attributes_are_guarded():
    weight, bias = RNG.standard_normal((4, 2)).astype(np.float32), 0.25

    @op.kernel
    def f(x):
        return x @ weight + bias

    np.testing.assert_allclose(f(X), X @ weight + 0.25, rtol=1e-5)
    bias = 3.0
    np.testing.assert_allclose(f(X), X @ weight + 3.0, rtol=1e-5)

    class Linear:
        def __init__(self):
            self.w = RNG.standard_normal((4, 2)).astype(np.float32)

        @op.kernel
        def forward(self, x):
            return x @ self.w

    a, b = Linear(), Linear()
    np.testing.assert_allclose(a.forward(X), X @ a.w, rtol=1e-5)
    np.testing.assert_allclose(b.forward(X), X @ b.w, rtol=1e-5)      # each instance its own weights
    a.w = a.w - 1.0                                                    # an SGD step that rebinds
    np.testing.assert_allclose(a.forward(X), X @ a.w, rtol=1e-5)
    assert a.forward.kernel is a.forward.kernel                       # one kernel per instance
    with pytest.raises(ArgumentError, match="missing a required argument"):
        Linear.forward(X)                                             # unbound: self is missing


def test_a_gradient_reads_its_captured_weights_at_each_call():
    w = RNG.standard_normal((4, 2)).astype(np.float64)
    x = X.astype(np.float64)
    grad = op.grad(lambda x: op.sum((x @ w) ** 2))
    np.testing.assert_allclose(grad(x), 2 * (x @ w) @ w.T, rtol=1e-10)
    w *= 3.0
    np.testing.assert_allclose(grad(x), 2 * (x @ w) @ w.T, rtol=1e-10)


def test_an_array_built_inside_the_function_is_captured_under_a_generic_name():
    @op.kernel
    def f(x):
        return x + np.arange(4, dtype=np.float32)

    np.testing.assert_array_equal(f(X), X + np.arange(4, dtype=np.float32))
    assert [n.attr("name") for n in f.trace(X).inputs] == ["x", "captured0"]


def test_a_name_that_keeps_changing_warns_once():
    step = 0

    @op.kernel
    def f(x):
        return x * step

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(RETRACE_WARNING_AFTER + 3):
            np.testing.assert_array_equal(f(X), X * np.float32(step))
    retraces = [w for w in caught if issubclass(w.category, RetraceWarning)]
    assert len(retraces) == 1 and "'step'" in str(retraces[0].message)
    assert retraces[0].filename == __file__


def test_a_tensor_argument_in_ever_new_shapes_warns_once():
    @op.kernel
    def f(x):
        return x * 2.0

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, RETRACE_WARNING_AFTER + 3):
            f(np.ones(n, np.float32))
    retraces = [w for w in caught if issubclass(w.category, RetraceWarning)]
    assert len(retraces) == 1 and "'x' has come in 8 shapes" in str(retraces[0].message)


def test_a_kernel_called_inside_another_is_guarded_there():
    @op.kernel
    def inner(x):
        return x @ W * SCALE

    @op.kernel
    def outer(x):
        return inner(x) + 1.0

    global SCALE
    saved = SCALE
    try:
        assert [n.attr("name") for n in outer.trace(X).inputs] == ["x", "W"]
        np.testing.assert_allclose(outer(X), X @ W * SCALE + 1, rtol=1e-5)
        SCALE = 4.0
        np.testing.assert_allclose(outer(X), X @ W * 4.0 + 1, rtol=1e-5)
    finally:
        SCALE = saved


def test_a_gradient_called_inside_a_kernel_is_guarded_there():
    global W
    saved = W
    try:
        g = op.grad(lambda x: op.sum(x @ W))

        @op.kernel
        def outer(x):
            return g(x) * 2.0

        np.testing.assert_allclose(outer(X), 2 * np.broadcast_to(W.sum(1), X.shape), rtol=1e-5)
        W = np.ones((4, 4), np.float32)
        np.testing.assert_allclose(outer(X), np.full(X.shape, 8.0), rtol=1e-6)
    finally:
        W = saved


class Affine:
    def __init__(self, w):
        self.w = w

    @op.kernel
    def forward(self, x):
        return x @ self.w


def test_method_kernels_neither_keep_their_instance_alive_nor_travel_with_copies():
    import copy
    import gc
    import pickle
    import weakref
    a = Affine(np.eye(4, dtype=np.float32))
    np.testing.assert_array_equal(a.forward(X), X)
    b = copy.copy(a)
    b.w = 2 * np.eye(4, dtype=np.float32)
    np.testing.assert_array_equal(b.forward(X), 2 * X)                   # the copy's own kernel
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(a)).forward(X), X)
    np.testing.assert_array_equal(copy.deepcopy(a).forward(X), X)
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None


def test_a_class_without_weak_references_is_told_its_kernel_traces_each_call():
    class Slotted:
        __slots__ = ("w",)

        def __init__(self):
            self.w = np.eye(4, dtype=np.float32)

        @op.kernel
        def forward(self, x):
            return x @ self.w

    with pytest.warns(RuntimeWarning, match="add '__weakref__' to Slotted.__slots__"):
        np.testing.assert_array_equal(Slotted().forward(X), X)
    with pytest.raises(ArgumentError, match="call instance.forward"):
        Affine.forward(Affine(np.eye(4, dtype=np.float32)), X)
