"""`--run`'s check of a plan against the unfused reference: its error measure and its bound."""

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.cli.plan_check import _allowed, plan_error


def test_plan_error_reads_nan_and_inf_as_numpy_compares_them():
    assert plan_error(np.array([1.0, np.nan]), np.array([1.0, np.nan])) == 0.0
    assert plan_error(np.array([np.inf, 2.0]), np.array([np.inf, 2.0])) == 0.0
    assert plan_error(np.array([1.0, 2.0]), np.array([1.0, np.nan])) == np.inf
    assert plan_error(np.array([1.0, 2.2]), np.array([1.0, 2.0])) == pytest.approx(0.1)
    assert plan_error(np.array([1 - 2j]), np.array([1 + 2j])) == pytest.approx(4 / abs(1 + 2j))   # conjugated


def _output(fn, *arrays):
    return op.kernel(fn).trace(*arrays).outputs[0]


def test_a_float32_result_of_bfloat16_products_is_held_to_bfloat16s_bound():
    a = np.ones((8, 8), ml_dtypes.bfloat16)
    through_bf16 = _allowed(_output(lambda a, b: op.cast(a @ b, "float32") * 2.0, a, a), fast=False)
    upcast_first = _allowed(_output(lambda a, b: op.cast(a, "float32") @ op.cast(b, "float32"), a, a), fast=False)
    bf16_result = _allowed(_output(lambda a, b: a @ b, a, a), fast=False)
    assert through_bf16 == bf16_result > 10 * upcast_first         # bf16 inputs widened exactly: float32's
    assert _allowed(_output(lambda a: a > 0, a), fast=False) == 0.0
    assert _allowed(_output(lambda a: a, a), fast=False) == bf16_result     # an input returned as it is
