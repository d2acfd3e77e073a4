"""Products of two dtypes (`op.matmul(A8, B16, accum_dtype="fp32")`): the narrower operand is cast up
exactly to the promoted dtype, so the product runs as a one-dtype GEMM on the GPU (the fp8 operand
widened by an elementwise kernel, since every fp8 value is a bf16 value), and the result is what
numpy's promotion gives."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.plan_binding import bind_plan
from tessera_rw.pipeline import compile_program

CASES = [  # (a dtype, b dtype, the product's dtype)
    ("float8_e4m3", "bfloat16", DType.bfloat16),
    ("bfloat16", "float8_e5m2", DType.bfloat16),
    ("float16", "bfloat16", DType.float32),
    ("float8_e4m3", "float8_e5m2", DType.float16),
    ("bfloat16", "float32", DType.float32),
]


def product():
    @op.kernel
    def mm(a, b):
        return op.matmul(a, b, accum_dtype="fp32")
    return mm


@pytest.mark.parametrize("a_dtype, b_dtype, out", CASES)
def test_the_narrower_operand_is_cast_up_and_the_product_has_one_dtype(a_dtype, b_dtype, out):
    graph = product().trace(op.tensor((64, 32), a_dtype), op.tensor((32, 48), b_dtype))
    [y] = graph.outputs
    assert y.op == "matmul" and y.dtype is out
    assert [arg.dtype for arg in y.args] == [out, out]
    casts = [n for n in graph.nodes if n.op == "cast"]
    assert len(casts) == sum(DType.parse(d) is not out for d in (a_dtype, b_dtype))


def test_one_dtype_products_are_left_alone():
    graph = product().trace(op.tensor((64, 32), "fp8_e4m3"), op.tensor((32, 48), "fp8_e4m3"))
    assert [n.op for n in graph.nodes if n.op not in ("input",)] == ["matmul"]      # the native fp8 GEMM


def random_operands(rng, a_dtype, b_dtype, m=70, k=48, n=90):
    a = rng.standard_normal((m, k)).astype(DType.parse(a_dtype).numpy)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(DType.parse(b_dtype).numpy)
    return a, b


@pytest.mark.parametrize("a_dtype, b_dtype, out", CASES)
def test_eager_mixed_products_match_float64(a_dtype, b_dtype, out):
    a, b = random_operands(np.random.default_rng(1), a_dtype, b_dtype)
    got = op.matmul(a, b, accum_dtype="fp32")
    assert got.dtype == out.numpy
    want = a.astype(np.float64) @ b.astype(np.float64)
    tolerance = 2e-2 if out in (DType.bfloat16, DType.float16) else 1e-5
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < tolerance


@pytest.mark.parametrize("arch", ["A100-SXM", "H100-SXM"])
def test_an_fp8_times_bf16_linear_layer_has_a_gpu_kernel_for_every_step(arch):
    @op.kernel
    def linear(x, w, b):
        return op.gelu(op.matmul(x, w, accum_dtype="fp32") + b)
    traced = linear.trace(op.tensor((256, 128), "fp8_e4m3"), op.tensor((128, 512), "bf16"), op.tensor((512,), "bf16"))
    program = compile_program(traced, arch_named(arch))
    assert [s.op for s in program.plan.steps] == ["cast", "gemm"]          # bias and gelu in the epilogue
    bound = bind_plan(program.plan, program.arch, Numerics.DETERMINISTIC)  # raises when a step has no template
    assert [b.template.kind for b in bound] == ["elementwise", "gemm"]


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_generated_plan_computes_an_fp8_times_bf16_product():
    rng = np.random.default_rng(6)
    x, w = random_operands(rng, "float8_e4m3", "bfloat16", m=96, k=80, n=136)
    program = product().program(x, w)
    inputs = {"a": x, "b": w}
    want = x.astype(np.float64) @ w.astype(np.float64)
    for got in (run_plan_emulated(program.plan, inputs, arch=arch_named("H100-SXM"))[0],
                run_plan_on_cpu(program.plan, inputs)[0]):
        assert got.dtype == ml_dtypes.bfloat16
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 1e-2
