"""The GEMM template's bias-gradient product, matmul_bias_grad(a, b) = [a; 1ᵀ] @ b: a row of ones
under A that no load reads (so the output has M+1 rows), on every code path of the template.

Compiling each sample at every default schedule for sm_80 and sm_90 with zero spills and the register
model within bounds is test_template_contract.py's job (the samples are GemmTemplate.samples());
the GPU numerics are tests/gpu/test_gemm_bias_grad_numerics.py's. Here: what the template promises
about the op, the generated source (against a snapshot), and the numpy executor running it.

When a change to the kernel text is meant, accept the new snapshot with

    TESSERA_UPDATE_SNAPSHOTS=1 python -m pytest -q tests/codegen/test_gemm_bias_grad.py
"""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import kernel_check as kc
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmSimtSchedule, GemmTemplate
from tessera_rw.codegen.templates.registry import templates_for
from tessera_rw.lower.lowering import lower
from tessera_rw.tune.cost import kernel_cost

T = GemmTemplate()
H100 = arch_named("H100-SXM")
SAMPLES = [op for op in T.samples() if op.op == "matmul_bias_grad"]
SNAPSHOT = Path(__file__).parent / "snapshots" / "bias_grad" / "gemm_matmul_bias_grad_bf16.cu"


def bias_grad(m: int, k: int, n: int, dtype=DType.bfloat16, numerics=Numerics.DEFAULT) -> KernelOp:
    return KernelOp.of("matmul_bias_grad", (TensorType((m, k), dtype), TensorType((k, n), dtype)),
                       TensorType((m + 1, n), dtype), accum_dtype=None, numerics=numerics)


def matmul(m: int, k: int, n: int, dtype=DType.bfloat16) -> KernelOp:
    return KernelOp.of("matmul", (TensorType((m, k), dtype), TensorType((k, n), dtype)),
                       TensorType((m, n), dtype), accum_dtype=None)


def test_samples_reach_every_code_path():
    paths = {(T.resources(op, T.schedules(op, H100)[0], H100).unit.value, op.operands[0].dtype) for op in SAMPLES}
    assert paths == {("bf16", DType.bfloat16), ("bf16", DType.float16), ("fp32", DType.float32),
                     ("tf32", DType.float32)}
    assert any(op.operands[0].shape[0] % 128 == 0 for op in SAMPLES)     # the ones row alone in a tile row
    assert any(op.operands[0].shape[1] * 2 % 16 for op in SAMPLES)       # element-wise loads of ragged rows


def test_it_is_a_gemm_that_fuses_the_bias_gradient():
    op = bias_grad(256, 512, 128)
    (template,) = templates_for(op)
    assert template.kind_of(op) == "gemm" and template.fused(op) == ("bias_grad",)
    cost = kernel_cost(op, H100)
    assert cost.kind == "gemm" and cost.fused == ("bias_grad",)
    assert not T.accepts(bias_grad(64, 64, 64, DType.float64))             # no fp64 GEMM kernel
    half_accum = KernelOp.of("matmul_bias_grad", bias_grad(64, 64, 64).operands, bias_grad(64, 64, 64).result,
                             accum_dtype=DType.float16)
    assert not T.accepts(half_accum)                                        # fp32 accumulation only


@pytest.mark.parametrize("m", [255, 256, 1000])
def test_resources_count_the_ones_row_but_read_only_a(m):
    op, plain = bias_grad(m, 512, 384), matmul(m, 512, 384)
    for s in T.schedules(op, H100):
        r, base = T.resources(op, s, H100), T.resources(plain, s, H100)
        assert r.blocks == -(-(m + 1) // s.bm) * -(-384 // s.bn)           # M+1 output rows
        assert r.flops >= op.flops >= 2 * m * 384 * 512
        assert r.hbm_bytes - base.hbm_bytes == 384 * 2                      # one more row written, A read as is
        assert r.registers == base.registers and r.smem_bytes == base.smem_bytes


def test_kernel_names_tell_it_from_a_matmul_with_one_more_row():
    s = GemmSchedule()
    a, b = T.emit(bias_grad(256, 256, 256), s, H100).name, T.emit(matmul(257, 256, 256), s, H100).name
    assert a != b and "bgrad" in a


@pytest.mark.parametrize("op, schedule", [
    (bias_grad(256, 256, 256), GemmSchedule()),
    (bias_grad(255, 250, 256), GemmSchedule()),
    (bias_grad(256, 256, 256, DType.float32, Numerics.FAST), GemmSchedule(128, 64, 16, 2, 2, 3)),
    (bias_grad(100, 37, 60, DType.float32), GemmSimtSchedule()),
], ids=["bf16-cp.async", "bf16-elementwise", "tf32", "simt"])
def test_source_loads_ones_in_row_m_and_stores_m_plus_one_rows(op, schedule):
    source = T.emit(op, schedule, H100).source
    m = op.operands[0].shape[0]
    assert f"constexpr int M = {m + 1}," in source and f"constexpr int MA = {m};" in source
    assert "m0 + r < MA" in source and "m0 + r == MA" in source
    if op.operands[0].dtype is DType.bfloat16:
        assert "gemm_ones8(" in source and "0x3F80u" in source
    elif isinstance(schedule, GemmSchedule):
        assert "gemm_ones4(" in source
    else:
        assert "? 1.0f : 0.0f" in source


def test_fp16_ones_are_fp16_ones():
    assert "0x3C00u" in T.emit(bias_grad(64, 64, 64, DType.float16), GemmSchedule(64, 64, 32, 2, 2, 3), H100).source


def test_matmul_source_is_unchanged_by_the_ones_row():
    source = T.emit(matmul(256, 256, 256), GemmSchedule(), H100).source
    assert "MA" not in source and "gemm_ones" not in source


def test_generated_source_matches_snapshot():
    op = SAMPLES[0]
    source = T.emit(op, T.schedules(op, H100)[0], H100).source
    source = source if source.endswith("\n") else source + "\n"
    if os.environ.get("TESSERA_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(source, newline="")
    assert SNAPSHOT.exists(), f"no snapshot {SNAPSHOT.name}; write it with TESSERA_UPDATE_SNAPSHOTS=1"
    assert SNAPSHOT.read_text() == source, (f"the bias-gradient GEMM source for {op} differs from {SNAPSHOT.name}; "
                                            "if the change is meant, accept it with TESSERA_UPDATE_SNAPSHOTS=1")
    assert source.startswith(f"// {op}\n")


def test_gpu_checks_compare_every_row_of_a_packed_product():
    # kernel_check restricts big products to rows of A; the packed product's last row is no row of A,
    # so its reference is never restricted, whatever the size
    rng = np.random.default_rng(0)
    big = KernelOp.of("matmul_bias_grad", (TensorType((4096, 8192), DType.bfloat16),
                                           TensorType((8192, 4096), DType.bfloat16)),
                      TensorType((4097, 4096), DType.bfloat16), accum_dtype=None)
    assert kc.row_plan(big) is None
    for op in SAMPLES:
        assert kc.row_plan(op) is None, op
        exp = kc.expected(op, random_inputs(op, rng), rng)
        assert exp.rows is None and exp.value.shape == op.result.shape


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_numpy_executor_runs_the_packed_gemm(dtype):
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((40, 24)).astype(dtype), rng.standard_normal((40, 16)).astype(dtype)
    xn, dyn = make_input("x", x.shape, DType.parse(dtype)), make_input("dy", dy.shape, DType.parse(dtype))
    packed = make("matmul_bias_grad", make("transpose", xn, axes=(1, 0)), dyn, accum_dtype=None)
    (out,) = run_plan_on_cpu(lower(Graph("packed", (xn, dyn), (packed,))), {"x": x, "dy": dy})
    wide_x, wide_dy = x.astype(np.float64), dy.astype(np.float64)
    tol = 1e-5 if dtype is np.float32 else 2e-2
    np.testing.assert_allclose(out[:24].astype(np.float64), wide_x.T @ wide_dy, rtol=tol, atol=tol * 8)
    np.testing.assert_allclose(out[24].astype(np.float64), wide_dy.sum(0), rtol=tol, atol=tol * 8)
