"""var, std, clip, square, stack, split and logsumexp: numpy's (and scipy's) results, eager and
traced, gradients that match finite differences, and errors that say what to do."""

import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_rw import op
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tests.finite_differences import numeric_gradient

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 6))

# (ours, the reference) on one array, float64
CASES = {
    "var": (lambda x: op.var(x, axis=1), lambda x: np.var(x, axis=1)),
    "var-ddof-all-axes": (lambda x: op.var(x, ddof=1), lambda x: np.var(x, ddof=1)),
    "std-keepdims": (lambda x: op.std(x, axis=0, keepdims=True), lambda x: np.std(x, axis=0, keepdims=True)),
    "clip": (lambda x: op.clip(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    "clip-below-only": (lambda x: x.clip(0.0), lambda x: np.clip(x, 0.0, None)),
    "square": (lambda x: op.square(x), np.square),
    "stack": (lambda x: op.stack([x, 2 * x, x * x], axis=-1), lambda x: np.stack([x, 2 * x, x * x], axis=-1)),
    "logsumexp": (lambda x: op.logsumexp(x, axis=-1), lambda x: scipy.special.logsumexp(x, axis=-1)),
    "logsumexp-keepdims": (lambda x: op.logsumexp(x, axis=(0, 1), keepdims=True),
                           lambda x: scipy.special.logsumexp(x, axis=(0, 1), keepdims=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_composite_matches_numpy_eager_and_traced(case):
    ours, reference = CASES[case]
    want = reference(X)
    np.testing.assert_allclose(ours(X), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(op.kernel(ours)(X), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["var", "var-ddof-all-axes", "std-keepdims", "clip", "stack", "logsumexp"])
def test_composite_gradient_matches_finite_differences(case):
    ours, reference = CASES[case]
    weights = RNG.standard_normal(np.shape(reference(X)))
    got = op.grad(lambda x: op.sum(ours(x) * weights))(X)
    want = numeric_gradient(lambda x: float(np.sum(reference(x) * weights)), X)
    assert np.abs(got - want).max() <= 1e-6 * max(1.0, np.abs(want).max())


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 12), cuts=st.lists(st.integers(-14, 14), max_size=4))
def test_split_at_indices_is_numpys(size, cuts):
    x = np.arange(size * 2.0).reshape(2, size)
    ours, want = op.split(x, cuts, axis=1), np.split(x, cuts, axis=1)
    assert [p.shape for p in ours] == [p.shape for p in want]
    for got, expected in zip(ours, want):
        np.testing.assert_array_equal(got, expected)


def test_split_into_sections_traced():
    parts = op.kernel(lambda x: tuple(op.split(x, 3, axis=1)))(X)
    for got, want in zip(parts, np.split(X, 3, axis=1)):
        np.testing.assert_array_equal(got, want)


def test_logsumexp_of_infinite_rows_is_scipys():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf], [np.inf, 1.0], [np.nan, 1.0]])
    with np.errstate(divide="ignore", invalid="ignore"):     # log(0) and inf - inf, as numpy's own
        want = scipy.special.logsumexp(x, axis=1)
        np.testing.assert_array_equal(op.logsumexp(x, axis=1), want)            # -inf, 0, inf, nan
        np.testing.assert_array_equal(op.kernel(lambda x: op.logsumexp(x, axis=1))(x), want)


@pytest.mark.parametrize("x", [np.array([[True, False, True]]), np.array([[1, 2, 30]], np.int32)],
                         ids=["bool", "int32"])
def test_logsumexp_of_bools_and_integers_is_in_float32(x):
    want = scipy.special.logsumexp(x.astype(np.float64), axis=1)
    for got in (op.logsumexp(x, axis=1), op.kernel(lambda x: op.logsumexp(x, axis=1))(x)):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_errors_name_the_op_and_what_to_do():
    with pytest.raises(ShapeError, match=r"split(.|\n)*does not split into 4 equal parts(.|\n)*split points"):
        op.split(X, 4, axis=1)
    with pytest.raises(ShapeError, match=r"stack(.|\n)*one shape(.|\n)*concatenate"):
        op.stack([X, X[:, :2]])
    with pytest.raises(AttributeValueError, match=r"var: ddof must be an int in \[0, 4\)"):
        op.var(X, axis=0, ddof=4)


def test_an_op_there_is_not_says_how_to_write_it():
    with pytest.raises(AttributeError, match="no op 'cumsum': there is no scan op"):
        op.cumsum  # noqa: B018
    with pytest.raises(AttributeError, match="did you mean 'softmax'"):
        op.softmx  # noqa: B018
    with pytest.raises(AttributeError, match="'argmax'.*index-valued"):
        op.kernel(lambda x: x.argmax())(X)
    assert not hasattr(op, "sort") and hasattr(op, "logsumexp")


def test_eager_calls_give_what_a_kernel_gives_arrays_of_the_same_dtype():
    import ml_dtypes
    b = RNG.standard_normal((3, 4)).astype(ml_dtypes.bfloat16)
    for fn in (lambda x: op.var(x, axis=1), lambda x: op.logsumexp(x), lambda x: op.clip(x, -0.5, 0.5)):
        eager, traced = fn(b), op.kernel(fn)(b)
        assert isinstance(eager, np.ndarray) and eager.dtype == traced.dtype == ml_dtypes.bfloat16


def test_a_16_bit_variance_and_deviation_are_computed_in_float32_as_torchs():
    x = np.array([[0.0, 400.0, -400.0, 0.0], [300.0, -300.0, 300.0, -300.0], [1.0, 2.0, 3.0, 4.0]], np.float16)
    wide = x.astype(np.float64)
    for fn, ref in ((lambda x: op.std(x, axis=-1), np.std), (lambda x: op.var(x[2:], axis=-1, ddof=1),
                                                             lambda w, axis: np.var(w[2:], axis=axis, ddof=1))):
        want = ref(wide, axis=-1)
        for got in (fn(x), op.kernel(fn)(x)):
            assert got.dtype == np.float16
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3)     # 300², not inf
