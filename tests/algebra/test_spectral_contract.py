"""spectral_contract: the per-frequency channel sum of a cross-correlation, against explicit loops."""

import numpy as np
import pytest

from tessera_rw import DType, TesseraError
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph

RNG = np.random.default_rng(11)


def cplx(*shape):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex128)


@pytest.mark.parametrize("groups, cin, cout", [(1, 3, 2), (2, 4, 6), (4, 4, 4)])
def test_against_loops(groups, cin, cout):
    x, w = cplx(2, cin, 5), cplx(cout, cin // groups, 5)
    xi, wi = make_input("x", x.shape, DType.complex128), make_input("w", w.shape, DType.complex128)
    g = Graph("c", (xi, wi), (make("spectral_contract", xi, wi, groups=groups),))
    got = evaluate(g, {"x": x, "w": w})[0]
    want = np.zeros((2, cout, 5), np.complex128)
    per_in, per_out = cin // groups, cout // groups
    for n in range(2):
        for o in range(cout):
            grp = o // per_out
            for c in range(per_in):
                want[n, o] += x[n, grp * per_in + c] * np.conj(w[o, c])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_rejects_real_operands_and_bad_groups():
    x, w = make_input("x", (1, 4, 3), DType.float32), make_input("w", (2, 4, 3), DType.float32)
    with pytest.raises(TesseraError, match="spectra"):
        make("spectral_contract", x, w, groups=1)
    xc, wc = make_input("x", (1, 4, 3), DType.complex64), make_input("w", (2, 3, 3), DType.complex64)
    with pytest.raises(TesseraError, match="groups"):
        make("spectral_contract", xc, wc, groups=1)
