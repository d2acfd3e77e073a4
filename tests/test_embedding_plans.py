"""An embedding's lookup and its gradient are one kernel each: at GPT-2's size (a 50257 x 768
bf16 table, 8 x 1024 tokens) the lookup reads the rows it takes and the gradient reads the
cotangent once, by the cost model; at small sizes both plans run in the CPU emulator (every
kernel compiled from its CUDA source) and on the numpy executor, against float64 numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated


def lookup(table, tokens):
    return table[tokens]


def table_grad(table, tokens, dy):
    return op.grad(lambda t: op.sum(t[tokens] * dy))(table)


def test_at_gpt2_size_each_is_one_kernel_moving_what_it_must():
    table, tokens = op.tensor((50257, 768), "bfloat16"), op.tensor((8, 1024), "int32")
    dy = op.tensor((8, 1024, 768), "bfloat16")
    rows = 8 * 1024 * 768 * 2
    (forward,) = op.kernel(lookup).explain(table, tokens).candidates[0].kernels
    assert forward.fused == ("take",) and forward.hbm_bytes <= 2 * rows + 8 * 1024 * 4
    (backward,) = op.kernel(table_grad).explain(table, tokens, dy).candidates[0].kernels
    assert backward.fused == ("index_add",) and backward.hbm_bytes <= rows + 50257 * 768 * 2 + 8 * 1024 * 4
    assert forward.est_us < 50 and backward.est_us < 100


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (ml_dtypes.bfloat16, 1e-2)], ids=["f32", "bf16"])
def test_lookup_and_gradient_match_numpy(dtype, rtol):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((300, 64)).astype(dtype)
    tokens = rng.integers(-300, 300, (4, 50)).astype(np.int32)
    tokens[0, :10] = 7                                   # a token repeated: its gradient sums ten rows
    dy = rng.standard_normal((4, 50, 64)).astype(dtype)
    want_rows = table.astype(np.float64)[tokens]
    want_grad = np.zeros((300, 64))
    np.add.at(want_grad, tokens % 300, dy.astype(np.float64))
    for fn, args, want in ((lookup, (table, tokens), want_rows), (table_grad, (table, tokens, dy), want_grad)):
        kernel = op.kernel(fn)
        assert len(kernel.program(*args).plan.steps) == 1
        np.testing.assert_allclose(kernel(*args).astype(np.float64), want, rtol=rtol, atol=rtol * 4)
        if emulator.available():
            names = dict(zip(("table", "tokens", "dy"), args))
            (got,) = run_plan_emulated(kernel.program(*args).plan, names)
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * 4)
