"""Zero-size tensors (an empty batch, an empty key axis) compute what numpy and torch give, on the
numpy executor and under a forced emulator alike: a plan over them launches nothing."""

import numpy as np
import pytest

from tessera_rw import op

Q = np.random.default_rng(5).standard_normal((1, 2, 4, 8)).astype(np.float32)
NO_KEYS = np.ones((1, 2, 0, 8), np.float32)

CASES = [
    ("softmax over an empty axis", lambda x: op.softmax(x, axis=-1), (np.ones((3, 0), np.float32),),
     np.ones((3, 0), np.float32)),
    ("log_softmax over an empty axis", lambda x: op.log_softmax(x * 2.0, axis=-1), (np.ones((3, 0), np.float32),),
     np.ones((3, 0), np.float32)),
    ("attention with no keys", lambda q, k, v: op.flash_attention(q, k, v), (Q, NO_KEYS, NO_KEYS),
     np.zeros((1, 2, 4, 8), np.float32)),
    ("conv1d of an empty batch", lambda x, w: op.conv1d(x, w),
     (np.ones((0, 2, 8), np.float32), np.ones((3, 2, 3), np.float32)), np.ones((0, 3, 6), np.float32)),
    ("a fused gemm of an empty batch", lambda x, w, b: op.softmax(x @ w + b, axis=-1),
     (np.ones((0, 16), np.float32), np.ones((16, 8), np.float32), np.zeros(8, np.float32)),
     np.ones((0, 8), np.float32)),
    ("a product over an empty contraction", lambda a, b: (a @ b) + 1.0,
     (np.ones((3, 0), np.float32), np.ones((0, 2), np.float32)), np.ones((3, 2), np.float32)),
]


@pytest.mark.parametrize("device", ["cpu", "emulator"])
@pytest.mark.parametrize("name, fn, args, want", CASES, ids=[c[0] for c in CASES])
def test_zero_size_programs_compute_numpys_result(name, fn, args, want, device, monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", device)
    got = op.kernel(fn)(*args)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_mean_over_nothing_is_nan_without_a_numpy_warning():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # numpy's "Mean of empty slice" would raise here
        got = op.kernel(lambda x: op.mean(x))(np.zeros(0, np.float32))
    assert np.isnan(got)
