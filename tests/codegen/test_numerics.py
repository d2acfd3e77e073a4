"""Numerics policies: the scoped policy, its place in KernelOp, what each template does under it
(tf32 gemm under `fast`, compensated sums under `kahan_sum`, nothing order-dependent ever), the
cost model seeing it (the host's compensated sum: test_compensated_sum.py). The `gpu` tests run the
kernels."""

from __future__ import annotations

import asyncio
import math
import re
import threading
from dataclasses import replace

import numpy as np
import pytest

from tessera_rw import numerics
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import MathUnit, arch_named
from tessera_rw.codegen.calibration import CALIBRATION_ARCHS, arch_for_sm
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics, NumericsError, current_numerics
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmSimtSchedule, GemmTemplate
from tessera_rw.codegen.templates.reduction import ReductionTemplate
from tessera_rw.codegen.templates.registry import templates
from tessera_rw.codegen.templates.rowwise import RowwiseTemplate
from tessera_rw.tune.cost import kernel_cost

H100 = arch_named("H100-SXM")
F32, BF16 = DType.float32, DType.bfloat16
FAST, DET, KAHAN = Numerics.FAST, Numerics.DETERMINISTIC, Numerics.KAHAN_SUM


def matmul(m, n, k, dtype=F32, policy=DET, batch=()) -> KernelOp:
    a, b = TensorType(batch + (m, k), dtype), TensorType((k, n), dtype)
    return KernelOp.of("matmul", (a, b), TensorType(batch + (m, n), dtype), accum_dtype=None, numerics=policy)


def reduce(name, shape, axes, dtype=F32, policy=DET, keepdims=False) -> KernelOp:
    x = TensorType(shape, dtype)
    return KernelOp.of(name, (x,), OPS[name].infer(x, axes, keepdims), axes=axes, keepdims=keepdims,
                       numerics=policy)


def softmax(shape, dtype=F32, policy=DET) -> KernelOp:
    x = TensorType(shape, dtype)
    return KernelOp.of("softmax", (x,), x, axis=len(shape) - 1, numerics=policy)


def layernorm(shape, dtype=F32, policy=DET) -> KernelOp:
    x = TensorType(shape, dtype)
    return KernelOp.of("layernorm", (x,), x, axes=(len(shape) - 1,), eps=1e-5, has_weight=False, has_bias=False,
                       numerics=policy)


# ---- the policy ------------------------------------------------------------------------------

def test_three_policies_parse_by_name_and_deterministic_is_the_default():
    assert [p.value for p in Numerics] == ["fast", "deterministic", "kahan_sum"]
    assert Numerics.DEFAULT is DET and current_numerics() is DET and numerics.current() is DET
    assert Numerics.parse("FAST") is FAST and Numerics.parse("kahan-sum") is KAHAN and Numerics.parse(KAHAN) is KAHAN
    with pytest.raises(NumericsError, match="'fast', 'deterministic', 'kahan_sum'"):
        Numerics.parse("tf32")
    with pytest.raises(NumericsError):
        Numerics.parse(None)


def test_policies_nest_and_the_outer_one_returns_even_after_an_error():
    with numerics.policy("fast") as outer:
        assert outer is FAST and numerics.current() is FAST
        with pytest.raises(RuntimeError):
            with numerics.policy("kahan_sum"):
                assert current_numerics() is KAHAN
                raise RuntimeError
        assert current_numerics() is FAST
    assert current_numerics() is DET
    with pytest.raises(NumericsError):
        with numerics.policy("approximate"):
            pass
    assert current_numerics() is DET


def test_a_plain_call_sets_the_policy_from_there_on_in_its_own_thread_only():
    def run():
        numerics.policy("fast")                   # a statement, as the guide writes it
        inner = numerics.current()
        with numerics.policy("kahan_sum"):
            in_block = numerics.current()
        return inner, in_block, numerics.current()

    seen = []
    thread = threading.Thread(target=lambda: seen.append(run()))
    thread.start()
    thread.join()
    assert seen == [(FAST, KAHAN, FAST)] and numerics.current() is DET     # the caller's thread is untouched


def test_each_thread_and_task_sees_its_own_policy():
    seen, inside, release = {}, threading.Event(), threading.Event()

    def worker():
        with numerics.policy("kahan_sum"):
            inside.set()
            release.wait(5)
            seen["worker"] = numerics.current()

    with numerics.policy("fast"):
        t = threading.Thread(target=worker)
        t.start()
        inside.wait(5)
        seen["main"] = numerics.current()      # the worker's block is open, ours is unaffected
        release.set()
        t.join()
    assert seen == {"worker": KAHAN, "main": FAST}

    async def task(name, gate):
        with numerics.policy(name):
            await gate.wait()
            return numerics.current()

    async def both():
        gate = asyncio.Event()
        runs = [asyncio.create_task(task(n, gate)) for n in ("fast", "kahan_sum")]
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*runs)

    assert asyncio.run(both()) == [FAST, KAHAN]


def test_the_policy_is_part_of_a_kernel_op():
    det, fast = matmul(64, 64, 64), matmul(64, 64, 64, policy="fast")
    assert det == matmul(64, 64, 64, policy="deterministic") and hash(det) == hash(matmul(64, 64, 64))
    assert det != fast and len({det, fast, matmul(64, 64, 64, policy=KAHAN)}) == 3
    assert fast.numerics is FAST and replace(fast, numerics="kahan_sum").numerics is KAHAN
    assert "numerics" not in str(det) and str(fast).endswith("[numerics=fast]")
    assert "numerics" not in fast.attr_map


# ---- gemm under `fast`: tf32 tensor cores ----------------------------------------------------

def test_fp32_gemm_under_fast_runs_tf32_mma_and_compiles_without_spills():
    t, op = GemmTemplate(), matmul(1000, 1000, 1000, policy=FAST)
    for sm in CALIBRATION_ARCHS:
        arch = arch_for_sm(sm)
        schedules = t.schedules(op, arch)
        assert schedules and all(isinstance(s, GemmSchedule) for s in schedules)
        source = t.emit(op, schedules[0], arch)
        assert "mma_tf32_1688(" in source.source and "tf32_round(" in source.source
        assert "cp_async_16(" in source.source and source.fast_math
        compiled = compile_cuda(source, sm)
        assert compiled.spill_bytes == 0
        assert t.resources(op, schedules[0], arch).unit is MathUnit.TF32


def test_fp32_gemm_stays_exact_fp32_simt_without_fast():
    t = GemmTemplate()
    for policy in (DET, KAHAN):
        op = matmul(1000, 1000, 1000, policy=policy)
        s = t.schedules(op, H100)[0]
        source = t.emit(op, s, H100)
        assert isinstance(s, GemmSimtSchedule) and "mma_" not in source.source and not source.fast_math
        assert t.resources(op, s, H100).unit is MathUnit.FP32
    bf16 = matmul(1024, 1024, 1024, BF16, FAST)     # 16-bit operands: the same mma, only fast math changes
    for arch, mma in ((arch_named("A100-SXM"), "mma_bf16_16816("), (H100, "wgmma_m64n256k16_bf16<")):
        source = t.emit(bf16, t.schedules(bf16, arch)[0], arch)
        assert mma in source.source and source.fast_math


def test_ragged_tf32_gemm_copies_elementwise():
    t, op = GemmTemplate(), matmul(1001, 1003, 999, policy=FAST, batch=(2,))
    source = t.emit(op, t.schedules(op, H100)[0], H100)
    assert "gemm_copy4(" in source.source and "cp_async_16(" not in source.source.split("extern")[1]


def test_a_fast_fp32_matmul_is_costed_on_tf32():
    det, fast = kernel_cost(matmul(4096, 4096, 4096), H100), kernel_cost(matmul(4096, 4096, 4096, policy=FAST), H100)
    assert (det.unit, fast.unit) == ("fp32", "tf32")
    assert fast.est_us * 3 < det.est_us


def test_extraction_costs_under_the_policy_in_force():
    from tessera_rw import op
    from tessera_rw.rules.registry import rulesets
    from tessera_rw.rules.saturate import rewrite
    from tessera_rw.tune.extract import candidate_of, extract_candidates

    graph = op.kernel(lambda a, b: a @ b).trace(a=op.tensor((4096, 4096), "float32"),
                                                b=op.tensor((4096, 4096), "float32"))
    result = rewrite(graph, rulesets())
    units = lambda c: [k.unit for k in c.kernels]  # noqa: E731
    assert units(extract_candidates(result, H100)[0]) == ["fp32"]
    with numerics.policy("fast"):
        best = extract_candidates(result, H100)[0]
        assert units(best) == ["tf32"] and units(candidate_of(graph, H100)) == ["tf32"]
        assert best.kernels[0].op.numerics is FAST
    assert units(candidate_of(graph, H100)) == ["fp32"]


# ---- kahan_sum: compensated statistics ---------------------------------------------------------

@pytest.mark.parametrize("op", [reduce("sum", (4096, 4096), (1,)), reduce("mean", (8192, 512), (1,), keepdims=True),
                                reduce("sum", (4096, 4096), (0,)), reduce("sum", (1 << 22,), (0,))],
                         ids=["row-block", "row-warp", "column", "one-output"])
def test_kahan_reductions_carry_a_compensation_and_fit_in_registers(op):
    t = ReductionTemplate()
    kahan = replace(op, numerics=KAHAN)
    for sm in CALIBRATION_ARCHS:
        arch = arch_for_sm(sm)
        for s in t.schedules(kahan, arch):
            source = t.emit(kahan, s, arch).source
            assert "kahan_add(" in source and "kahan_merge(" in source and "__fadd_rn" in source
            assert "kahan_add(" not in t.emit(op, s, arch).source
            compiled = compile_cuda(t.emit(kahan, s, arch), sm)
            assert compiled.spill_bytes == 0 and compiled.smem_bytes <= t.resources(kahan, s, arch).smem_bytes


def test_kahan_leaves_max_min_and_integer_sums_alone():
    t = ReductionTemplate()
    for op in (reduce("max", (4096, 4096), (1,), policy=KAHAN), reduce("min", (64, 4096), (0,), policy=KAHAN),
               reduce("sum", (1024, 1024), (0,), DType.int32, policy=KAHAN)):
        assert not t.compensated(op)
        assert "kahan_add(" not in t.emit(op, t.schedules(op, H100)[0], H100).source


@pytest.mark.parametrize("op", [softmax((8192, 8192), BF16), softmax((4096, 512)), softmax((64, 65536)),
                                layernorm((4096, 768), BF16), layernorm((64, 65536)),
                                KernelOp.of("rmsnorm", (TensorType((4096, 4096), F32),), TensorType((4096, 4096), F32),
                                            axes=(1,), eps=1e-6, has_weight=False, has_bias=False)],
                         ids=["softmax-block", "softmax-warp", "softmax-looped", "layernorm-warp", "layernorm-looped",
                              "rmsnorm"])
def test_kahan_rowwise_statistics_are_compensated_and_fit_in_registers(op):
    t = RowwiseTemplate()
    kahan = replace(op, numerics=KAHAN)
    for sm in CALIBRATION_ARCHS:
        arch = arch_for_sm(sm)
        s = t.schedules(kahan, arch)[0]
        source = t.emit(kahan, s, arch)
        assert "kahan_add(" in source.source and "_sum_kahan(" in source.source
        assert "kahan" not in t.emit(op, s, arch).source
        compiled = compile_cuda(source, sm)
        res = t.resources(kahan, s, arch)
        assert compiled.spill_bytes == 0 and compiled.smem_bytes <= res.smem_bytes
        assert abs(res.registers - compiled.registers) <= 0.25 * compiled.registers


# ---- deterministic: nothing order-dependent, and `fast` reaches every compile ------------------

def _every_sample():
    for template in templates():
        for sample in template.samples():
            for policy in Numerics:
                op = replace(sample, numerics=policy)
                for sm in CALIBRATION_ARCHS:
                    arch = arch_for_sm(sm)
                    for s in template.schedules(op, arch):
                        yield template, op, template.emit(op, s, arch)


# the templates with an order-dependent form (atomics), which they may emit under `fast` alone
ATOMIC_UNDER_FAST = {"FlashAttentionBwdTemplate"}     # dQ summed by the key blocks (dq="atomic")


# an atomic that only counts a grid split's arrivals (which block combines the parts, in part
# order whichever it is: reduction_split.py) adds nothing up
ARRIVAL = re.compile(r"atomicAdd\(&arrived\[[^\]]*\], 1u\)")


def test_no_kernel_uses_atomics_outside_fast_and_fast_math_follows_the_policy():
    """Every kernel outside `fast` reduces in a fixed order without atomics, which is what makes
    `deterministic` free. An atomic (split-K, stream-K, the attention backward's dQ sum) must be
    gated on the `fast` policy and this test taught so; counting arrivals is no sum."""
    seen = atomic = 0
    for template, op, source in _every_sample():
        uses = "atomic" in ARRIVAL.sub("", source.source).lower()
        if op.numerics is not FAST or type(template).__name__ not in ATOMIC_UNDER_FAST:
            assert not uses, f"{type(template).__name__} emits an atomic for {op}"
        atomic += uses
        assert source.fast_math == (op.numerics is FAST), f"{type(template).__name__}: {op}"
        seen += 1
    assert seen > 100 and atomic > 0


def test_the_attention_backward_sums_dq_with_atomics_only_under_fast():
    t = FlashAttentionBwdTemplate()
    arch = arch_for_sm(CALIBRATION_ARCHS[-1])
    op = t.samples()[0]
    fast = replace(op, numerics=FAST)
    atomic = next(s for s in t.schedules(fast, arch) if s.dq == "atomic")
    assert t.valid(fast, atomic, arch)
    assert t.emit(fast, atomic, arch).workspace_bytes > 0
    for policy in (Numerics.DETERMINISTIC, Numerics.KAHAN_SUM):
        strict = replace(op, numerics=policy)
        assert {s.dq for s in t.space(strict, arch)} == {"jobs"}
        assert not t.valid(strict, atomic, arch)
        with pytest.raises(ValueError, match="needs the 'fast' numerics policy"):
            t.emit(strict, atomic, arch)
        assert t.emit(strict, t.schedules(strict, arch)[0], arch).workspace_bytes == 0
    assert {s.dq for s in t.space(fast, arch)} == {"jobs", "atomic"}
    # its atomics measured slower than the fixed order's two extra products: the model agrees
    from tessera_rw.tune.cost import best_schedule
    assert best_schedule(t, fast, arch)[0].dq == "jobs"


# ---- on the GPU ---------------------------------------------------------------------------------

def _run(op, *inputs):
    from tessera_rw.codegen.launch import run_kernel
    return np.asarray(run_kernel(op, list(inputs)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (1001, 1003, 999)], ids=["aligned", "ragged"])
def test_tf32_gemm_matches_float64_within_tf32_rounding(shape):
    m, n, k = shape
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.sqrt(np.mean(ref ** 2))
    fast = _run(matmul(m, n, k, policy=FAST), a, b)
    exact = _run(matmul(m, n, k), a, b)
    fast_err, exact_err = np.abs(fast - ref).max() / scale, np.abs(exact - ref).max() / scale
    assert fast_err < 1e-2
    assert exact_err < 1e-5 < fast_err      # the fast one really ran in tf32, the default in fp32


@pytest.mark.gpu
def test_kahan_sum_of_4m_values_is_closer_to_float64():
    rng = np.random.default_rng(4)
    x = (np.float32(0.1) + rng.uniform(0, 1e-3, 1 << 22)).astype(np.float32)   # rounding errors all lean one way
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.launch import run_kernel
    from tessera_rw.codegen.templates.reduction import ReductionTemplate
    exact = math.fsum(x.astype(np.float64))
    op = reduce("sum", x.shape, (0,))
    one_block = next(s for s in ReductionTemplate().schedules(op, current_arch()) if s.blocks == 1)
    serial = float(run_kernel(op, [x], schedule=one_block))     # each thread sums thousands of values
    plain = float(_run(op, x))                                  # the grid split: a few hundred each
    kahan = float(_run(reduce("sum", x.shape, (0,), policy=KAHAN), x))
    assert abs(kahan - exact) <= np.spacing(np.float32(exact))
    assert abs(kahan - exact) < abs(serial - exact)
    assert abs(plain - exact) <= abs(serial - exact)


@pytest.mark.gpu
@pytest.mark.parametrize("op", [softmax((512, 8192), policy=KAHAN), softmax((16, 65536), policy=KAHAN),
                                layernorm((1024, 768), policy=KAHAN), layernorm((16, 65536), policy=KAHAN),
                                reduce("mean", (2048, 512), (1,), policy=KAHAN),
                                reduce("sum", (4096, 256), (0,), policy=KAHAN)],
                         ids=["softmax-block", "softmax-looped", "layernorm-warp", "layernorm-looped", "mean", "column"])
def test_kahan_kernels_match_the_reference(op):
    x = np.random.default_rng(5).standard_normal(op.operands[0].shape).astype(np.float32) + 3.0
    got = _run(op, x)
    want = OPS[op.op].reference(x.astype(np.float64), **op.attr_map)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("op", [reduce("sum", (4096, 4096), (1,)), reduce("sum", (4096, 4096), (0,)),
                                softmax((4096, 4096)), matmul(1024, 1024, 1024), matmul(1024, 1024, 1024, policy=FAST),
                                matmul(1024, 1024, 1024, BF16)],
                         ids=["row-sum", "column-sum", "softmax", "gemm-fp32", "gemm-tf32", "gemm-bf16"])
def test_deterministic_kernels_repeat_bit_for_bit(op):
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal(t.shape).astype(t.dtype.numpy) for t in op.operands]
    runs = [_run(op, *inputs) for _ in range(3)]
    assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:])


def test_an_eager_op_under_a_policy_computes_what_a_kernel_would():
    from tessera_rw import numerics, op
    x = np.tile(np.array([1e8] + [1.0] * 16 + [-1e8], np.float32), (3, 1))     # 16 ones lost beside 1e8
    with numerics.policy("kahan_sum"):
        kernel_sum = op.kernel(lambda a: op.sum(a, axis=-1))(x)
        np.testing.assert_array_equal(op.sum(x, axis=-1), kernel_sum)
        np.testing.assert_array_equal(op.sum(x, axis=-1), np.full(3, 16.0, np.float32))
