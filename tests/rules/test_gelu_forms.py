"""GELU written out (GPT-2's gelu_new with tanh, BERT's original with erf) is the gelu op, and so
joins the GEMM before it as its epilogue."""

import math

import numpy as np
import pytest
from scipy import special

from tessera_rw import op

RNG = np.random.default_rng(5)


def gelu_new(h):
    return 0.5 * h * (1.0 + op.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * op.power(h, 3.0))))


def gelu_new_cubed_by_hand(h):
    return 0.5 * h * (op.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * (h * h * h))) + 1.0)


def gelu_erf(h):
    return h * 0.5 * (1.0 + op.erf(h / math.sqrt(2.0)))


def _tanh_reference(h):
    return 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))


def _erf_reference(h):
    return 0.5 * h * (1 + special.erf(h / np.sqrt(2)))


@pytest.mark.parametrize("activation, reference, approximate", [
    (gelu_new, _tanh_reference, "gelu_tanh"), (gelu_new_cubed_by_hand, _tanh_reference, "gelu_tanh"),
    (gelu_erf, _erf_reference, "gelu")], ids=["gelu_new", "cubed-by-hand", "erf"])
def test_a_gelu_written_out_is_the_gemms_epilogue(activation, reference, approximate):
    x, w, b = (RNG.standard_normal(shape).astype(np.float32) for shape in ((32, 48), (48, 64), (64,)))
    k = op.kernel(lambda x, w, b: activation(x @ w + b))
    (step,) = k.program(x, w, b).plan.steps
    assert step.op == "gemm" and step.node.attr_map["activation"] == approximate
    wide = [a.astype(np.float64) for a in (x, w, b)]
    np.testing.assert_allclose(k(x, w, b), reference(wide[0] @ wide[1] + wide[2]), rtol=1e-4, atol=1e-4)


def test_a_tanh_gelu_with_other_constants_stays_as_written():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    k = op.kernel(lambda h: 0.5 * h * (1.0 + op.tanh(0.8 * (h + 0.044715 * op.power(h, 3.0)))))
    assert all("gelu" not in str(s.node.attr_map) and s.node.op != "gelu" for s in k.program(x).plan.steps)
