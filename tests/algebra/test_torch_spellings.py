"""torch's spellings a user brings along get numpy's in the error (or work, where numpy 2 takes
them too): unbiased= / correction= for ddof=, SDPA's is_causal= / attn_mask=, torch's two-axis
transpose, x.size(dim), x.type_as(y); clip's min= / max= and a tuple of axes for expand_dims run."""

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError

X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("call, named, hint", [
    (lambda x: op.var(x, axis=1, unbiased=True), "unbiased", "var(..., ddof=1)"),
    (lambda x: op.std(x, correction=0), "correction", "std(..., ddof=0)"),
    (lambda x: op.flash_attention(x, x, x, is_causal=True), "is_causal", "flash_attention(..., causal=True)"),
    (lambda x: op.flash_attention(x, x, x, attn_mask=x[0]), "attn_mask", "flash_attention(..., mask=...)"),
], ids=["unbiased", "correction", "is_causal", "attn_mask"])
def test_torchs_keyword_names_get_numpys_in_the_error(call, named, hint):
    for run in (call, op.kernel(call)):
        with pytest.raises(ArgumentError) as info:
            run(X)
        assert f"for torch's {named}=" in info.value.detail and info.value.hint == hint


def test_torchs_two_axis_transpose_and_size_and_type_as_say_what_to_write():
    with pytest.raises(ArgumentError, match="one tuple") as info:
        op.kernel(lambda x: op.transpose(x, 1, 2))(X)
    assert info.value.hint.startswith("op.swapaxes(x, 1, 2)")
    with pytest.raises(ArgumentError, match="element count") as info:
        op.kernel(lambda x: x * x.size(-1))(X)
    assert "x.shape[dim]" in info.value.hint
    with pytest.raises(AttributeError, match=r"type_as'; use x.astype\(y.dtype\)"):
        op.kernel(lambda x: x.type_as(x))(X)
    np.testing.assert_array_equal(op.kernel(lambda x: x * x.size)(X), X * X.size)     # numpy's count still


def test_clip_takes_min_and_max_and_expand_dims_a_tuple_of_axes_as_numpy_2_does():
    np.testing.assert_array_equal(op.kernel(lambda x: op.clip(x, min=-0.5, max=0.5))(X), np.clip(X, -0.5, 0.5))
    np.testing.assert_array_equal(op.clip(X, max=0.1), np.clip(X, None, 0.1))
    for axes in ((0, 2), (-1, 1), 3):
        assert op.kernel(lambda x: op.expand_dims(x, axes))(X).shape == np.expand_dims(X, axes).shape


def test_a_bound_given_twice_and_dim_for_axes_are_refused_naming_ours():
    with pytest.raises(ArgumentError, match="each bound once"):
        op.clip(X, 0.5, min=0.1)
    with pytest.raises(ArgumentError, match="axes= for torch's dim=") as info:
        op.kernel(lambda x: op.transpose(x, dim=(1, 0, 2)))(X)
    assert info.value.hint == "transpose(..., axes=(1, 0, 2))"
