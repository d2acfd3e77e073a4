"""Elementwise results returned side by side are one kernel (lower/output_groups.py): an AdamW
step reads the parameter, the gradient and the moments once and writes the three results, each a
view of its block; the numpy executor and the CPU emulator agree with float64 numpy; a group that
shares nothing, or whose results differ in type, stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated


def adamw(p, g, m, v):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p * (1 - 1e-6) - 1e-4 * m2 / (op.sqrt(v2) + 1e-8), m2, v2


def adamw_reference(p, g, m, v):
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return p * (1 - 1e-6) - 1e-4 * m2 / (np.sqrt(v2) + 1e-8), m2, v2


def test_an_optimizer_step_is_one_kernel_reading_each_tensor_once():
    shape = op.tensor((4096, 4096), "float32")
    report = op.kernel(adamw).explain(shape, shape, shape, shape)
    (kernel,) = report.candidates[report.chosen].kernels
    assert "multi_output" in kernel.fused and kernel.hbm_bytes == 7 * 4096 * 4096 * 4


def test_its_results_match_numpy_on_the_host_and_in_the_emulator():
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal((256, 300)).astype(np.float32) for _ in range(3))
    v = rng.random((256, 300)).astype(np.float32)
    kernel = op.kernel(adamw)
    plan = kernel.program(p, g, m, v).plan
    assert [s.op for s in plan.steps] == ["multi_elementwise"]
    want = adamw_reference(*(a.astype(np.float64) for a in (p, g, m, v)))
    runs = [kernel(p, g, m, v)] + ([run_plan_emulated(plan, dict(p=p, g=g, m=m, v=v))] if emulator.available() else [])
    for got in runs:
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fn", [lambda x, y: (x * 2.0, y + 1.0),                       # nothing shared
                                lambda x, y: (x * 2.0, op.cast(x, "bfloat16"))],          # two dtypes
                         ids=["disjoint", "two-dtypes"])
def test_results_that_share_nothing_or_differ_in_type_stay_apart(fn):
    x = np.ones((64, 64), np.float32)
    steps = [s.op for s in op.kernel(fn).program(x, x).plan.steps]
    assert "multi_elementwise" not in steps and len(steps) == 2


def test_the_parameters_of_a_model_are_a_kernel_each_however_many_share_a_shape():
    def three(p1, g1, m1, v1, p2, g2, m2, v2, p3, g3, m3, v3):
        return adamw(p1, g1, m1, v1), adamw(p2, g2, m2, v2), adamw(p3, g3, m3, v3)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((64, 96)).astype(np.float32) for _ in range(12)]
    for i in (3, 7, 11):
        args[i] = np.abs(args[i])                       # second moments
    kernel = op.kernel(three)
    assert [s.op for s in kernel.program(*args).plan.steps] == ["multi_elementwise"] * 3
    for k, got in enumerate(kernel(*args)):
        want = adamw_reference(*(a.astype(np.float64) for a in args[4 * k:4 * k + 4]))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_group_whose_blocks_would_start_unaligned_stays_apart():
    x = np.ones(1001, np.float32)                      # 4004 bytes: block 1 would start off 16 bytes
    steps = [s.op for s in op.kernel(lambda x, y: (op.exp(x) * y, op.exp(x) + y)).program(x, x).plan.steps]
    assert "multi_elementwise" not in steps and "slice" not in steps


def test_a_result_another_reads_is_read_rounded_as_it_is_returned():
    x = np.full((8, 64), 300.0, np.float16)
    a, b = (np.asarray(r) for r in op.kernel(lambda x, y: (x * y, x * y * 0.001))(x, x))
    assert np.isinf(a).all() and np.isinf(b).all()     # 90000 overflows float16 before the second product
    if emulator.available():
        kernel = op.kernel(lambda x, y: (x * y, x * y * 0.001))
        plan = kernel.program(x, x).plan
        assert [s.op for s in plan.steps] == ["multi_elementwise"]
        assert all(np.isinf(r).all() for r in run_plan_emulated(plan, {"x": x, "y": x}))


def test_a_rate_every_parameter_reads_does_not_join_their_groups():
    def two(p1, g1, m1, v1, p2, g2, m2, v2, lr):
        def step(p, g, m, v):
            m2 = 0.9 * m + 0.1 * g
            v2 = 0.999 * v + 0.001 * g * g
            return p - lr * m2 / (op.sqrt(v2) + 1e-8), m2, v2
        return step(p1, g1, m1, v1), step(p2, g2, m2, v2)
    x = op.tensor((256, 256), "float32")
    steps = [s.op for s in op.kernel(two).program(*(x,) * 8, op.tensor((), "float32")).plan.steps]
    assert steps == ["multi_elementwise"] * 2


def test_results_that_are_single_ops_group_too():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((128, 128)).astype(np.float32)
    kernel = op.kernel(lambda x, w: (x @ w + 1.0, (x @ w) * 2.0))
    assert [s.op for s in kernel.program(x, w).plan.steps] == ["matmul", "multi_elementwise"]
    a, b = kernel(x, w)
    np.testing.assert_allclose(a, x @ w + 1.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, (x @ w) * 2.0, rtol=1e-5, atol=1e-5)
