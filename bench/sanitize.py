"""`python -m bench sanitize`: every default schedule of the Hopper kernels, once, on small shapes,
for a run under compute-sanitizer (racecheck, synccheck, memcheck):

    compute-sanitizer --tool racecheck --error-exitcode 1 python -m bench sanitize

The shapes are small so that the instrumented launches finish in seconds, yet each covers more than
one tile (and a ragged one for the GEMM) so that barriers between pipeline stages and tiles are
exercised. Each launch's output is poisoned first and checked against a float64 reference, so the
run also fails on a wrong result. The attention backward's kernels follow (the forward writing
each row's logsumexp, the statistics read off it, flash_attention_bwd in its fixed-order form and,
under `fast`, in its atomic one, which meets across blocks in a workspace), checked against the
ops' own references. Then the kernels whose blocks meet in a workspace behind a fence
and an arrival counter (a reduction to a scalar split over the grid, a convolution's weight gradient
split along K, a column reduce with few output tiles) and the norm backward's row kernels (dx
alone, with its row statistics, and with the weight and bias gradients' partial sums, whose
blocks each walk several rows with barriers in each row), likewise.
Then the kernels that read (and write) strided views of their operands' storage, where an index
off by a stride lands outside the buffer for memcheck to see: attention over a packed q|k|v
projection writing its heads merged (ragged, causal, GQA), rotary embeddings computed where their
concatenate is read, a gated unit reading both halves of its projection, and QK-norm's rows.
Last, the variants: a GEMM's (gemm_variants.py), the persistent forms of the TMA defaults, whose
blocks each walk several tiles with their stages and barrier phases running on across them, and
walks in another order, on products with more tiles than the GPU has SMs; and the attention
forward's producer forms (attention_tma_cuda.py), whose producer warpgroup hands K/V stages to the
consumers through mbarriers, with and without the consumers' turns at the tensor cores, in two
stages and three, over ragged causal GQA heads and a masked batch.
racecheck and synccheck see shared memory and barriers; a broken handshake between blocks through
global memory shows as a wrong result, which the checks against the references catch.
`--kernels rows|backward|cross-block|views|variants` runs one part. The exit status is 1 when any schedule
is wrong.
"""

from __future__ import annotations

import sys

from bench.gpu import TOLERANCE, kernels_to_compile, precompile, preflight, row_schedules
from bench.gpu_rows import (BF16, adamw_row, attention_row, batch_norm_sums_row, cross_entropy_row, embedding_rows,
                            epilogue_row, fp8_gemm_row, gemm_row, layernorm_row, logsumexp_row, max_pool_rows,
                            softmax_row)
from bench.gpu_timing import rel_error, run_poisoned


def small_rows():
    return [gemm_row(512), epilogue_row(384, 320, 192), fp8_gemm_row(512),
            attention_row(1, 2, 384, 64, False), attention_row(1, 2, 384, 128, True),
            softmax_row(512), layernorm_row(512), cross_entropy_row(384, 1000),
            logsumexp_row(384, 1000), adamw_row(512), *embedding_rows(1000, 64, 300),
            batch_norm_sums_row(4, 8, 64), *max_pool_rows(2, 8, 30)]


def backward_ops() -> list:
    """The attention backward's kernels on small shapes, causal and not, D = 64 and 128."""
    from dataclasses import replace
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.codegen.templates.attention import with_lse
    from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
    from tessera_rw.codegen.templates.attention_stats import AttentionStatsFromLseTemplate
    ops = []
    for d, causal in ((64, False), (128, True)):
        sample = FlashAttentionBwdTemplate().sample(1, 2, 384, d, BF16, causal)
        ops += [with_lse(attention_row(1, 2, 384, d, causal).op), sample, replace(sample, numerics=Numerics.FAST)]
    return ops + [AttentionStatsFromLseTemplate.sample((1, 2, 384, 64), BF16)]


def cross_block_ops() -> list:
    """Kernels whose blocks combine their parts in a workspace (the last to arrive sums them: row and
    column reductions split over the grid, split-K convs), and the norm backward's row kernels, on
    small shapes."""
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.codegen.templates.conv_problem import conv_op
    x = TensorType((4, 256, 768), BF16)
    long = TensorType((1 << 20,), DType.float32)
    rows = TensorType((1024, 768), BF16)
    columns = TensorType((2048, 1024), BF16)
    ragged = TensorType((3001, 200), DType.float32)
    return [KernelOp.of("sum", (x,), TensorType((), BF16), axes=(0, 1, 2), keepdims=False),
            KernelOp.of("sum", (columns,), TensorType((1024,), BF16), axes=(0,), keepdims=False),
            KernelOp.of("sum", (ragged,), TensorType((200,), DType.float32), axes=(0,), keepdims=False,
                        numerics=Numerics.KAHAN_SUM),
            KernelOp.of("sum", (long,), TensorType((), DType.float32), axes=(0,), keepdims=False,
                        numerics=Numerics.KAHAN_SUM),
            conv_op((16, 8, 30, 30), (16, 8, 28, 28), DType.float32, padding=((0, 0), (0, 0))),
            conv_op((32, 16, 30, 30), (32, 16, 28, 28), BF16, padding=((0, 0), (0, 0))),
            KernelOp.of("norm_backward", (rows, rows, TensorType((768,), BF16), rows), rows, norm="layernorm",
                        axes=(1,), eps=1e-5, has_weight=True, has_residual=True),
            *(norm_backward_packed(name, TensorType((1000, 1024), BF16), **extra)
              for name, extra in (("norm_backward_stats", {}), ("norm_backward_grads", {"parts": 96})))]


def view_ops() -> list:
    """Kernels reading views in place, on small ragged shapes (lower/attention_views.py,
    attention_writes.py, view_reads.py, concat_reads.py, conv_views.py): a training step's attention
    among them."""
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.algebra.ops import OPS
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.attention_backward_problem import packed_qkv_backward
    from tessera_rw.codegen.templates.attention_problem import packed_qkv_attention, packed_qkv_lse
    from tessera_rw.codegen.templates.attention_stats import AttentionStatsFromLseTemplate
    from tessera_rw.codegen.templates.conv_problem import strided_conv_op, swapped_leading

    def of(name: str, *operands, **attrs):
        return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs)
    x, table = TensorType((2, 4, 200, 64), BF16), TensorType((200, 64), BF16)
    h = TensorType((2, 200, 3 * 4 * 64), BF16)
    dense, rows = (51200, 12800, 64, 1), (0, 0, 64, 1)           # x's strides, the tables' (repeated per head)
    rope = of("concatenated_elementwise", x, table, table, x, axis=3, sizes=(32, 32), shape=x.shape,
              exprs="sub(mul($0,$1),mul($3,$2));add(mul($0,$1),mul($3,$2))", strides=(dense + rows * 2 + dense) * 2,
              offsets=(0, 0, 0, 32, 32, 32, 32, 0), shared=(0, 1, 2, 0))
    gated = TensorType((300, 2 * 520), BF16)
    return [packed_qkv_attention(2, 4, 330, 64, BF16, causal=True),
            packed_qkv_attention(1, 4, 200, 128, BF16, kv_heads=2),
            packed_qkv_lse(2, 4, 330, 64, BF16, causal=True),
            AttentionStatsFromLseTemplate.sample((2, 4, 330, 64), BF16, merged=True),
            packed_qkv_backward(2, 4, 330, 64, BF16, causal=True),
            rope,
            of("strided_elementwise", gated, gated, expr="mul(silu($0),$1)", shape=(300, 520),
               strides=(1040, 1, 1040, 1), offsets=(0, 520)),
            of("strided_normalization", h, TensorType((64,), BF16), expr="$0", norm="rmsnorm", axes=(3,), eps=1e-6,
               has_weight=True, has_bias=False, post="$0", shape=(2, 4, 200, 64), strides=(153600, 64, 768, 1),
               offsets=(256,)),
            # a 3x3 weight gradient reading xᵀ and dYᵀ in place and writing dW transposed, ragged
            # planes, a split K
            strided_conv_op((3, 24, 15, 13), swapped_leading((3, 24, 15, 13)), (3, 40, 13, 11),
                            swapped_leading((3, 40, 13, 11)), BF16, out_swapped=True),
            # ... padded, with the bias gradient from an image of ones beside it
            strided_conv_op((3, 24, 15, 13), swapped_leading((3, 24, 15, 13)), (3, 40, 15, 13),
                            swapped_leading((3, 40, 15, 13)), BF16, out_swapped=True, padding=((1, 1), (1, 1)),
                            bias_grad=True)]


def norm_backward_packed(name: str, x, **extra):
    """A layer norm's dx packed with what its weight gradient reads (`name`), over rows of x."""
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.algebra.ops import OPS
    from tessera_rw.codegen.kernel_op import KernelOp
    w = TensorType(x.shape[-1:], x.dtype)
    attrs = dict(norm="layernorm", axes=(x.ndim - 1,), eps=1e-5, has_weight=True, has_residual=False, **extra)
    return KernelOp.of(name, (x, x, w), OPS[name].infer(x, x, w, **attrs), **attrs)


def variant_ops(arch) -> list:
    """(op, schedules): GEMMs with more 128 x 256 tiles than `arch` has SMs (a ragged one, a bias
    gradient, one keeping its pre-activation, one times a gate), each at its first kind of default schedules in another
    walk and, for TMA ones, in the persistent form under two walks; then attention forwards at their
    producer forms (none where the arch has no TMA)."""
    from dataclasses import replace
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.gemm import GemmTemplate, TmaSchedule
    m, n, k = 16 * 128 - 48, (arch.sm_count // 16 + 1) * 256, 200      # ragged rows; K of 4 stages or fewer
    ops = [KernelOp.of("matmul", (TensorType((m, k), BF16), TensorType((k, n), BF16)), TensorType((m, n), BF16),
                       accum_dtype=None),
           KernelOp.of("matmul_bias_grad", (TensorType((m, k), BF16), TensorType((k, n), BF16)),
                       TensorType((m + 1, n), BF16), accum_dtype=None, trans_a=False),
           KernelOp.of("gemm_pre_act", (TensorType((m, k), BF16), TensorType((k, n), BF16), TensorType((n,), BF16)),
                       TensorType((2, m, n), BF16), scale=1.0, activation="gelu", has_bias=True, accum_dtype=None,
                       dtype=BF16),
           KernelOp.of("gated_gemm", (TensorType((m, k), BF16), TensorType((k, n), BF16), TensorType((m, n), BF16)),
                       TensorType((m, n), BF16), scale=1.0, activation="none", has_bias=False, accum_dtype=None,
                       dtype=BF16)]
    found = []
    for op in ops:
        defaults = GemmTemplate().schedules(op, arch)
        first = [s for s in defaults if type(s) is type(defaults[0])]
        forms = [replace(s, group=2) for s in first]
        forms += [replace(s, persistent=True, group=g) for s in first if isinstance(s, TmaSchedule) for g in (0, 4)]
        found.append((op, tuple(forms)))
    return found + attention_variant_ops(arch)


def attention_variant_ops(arch) -> list:
    """(op, schedules): a causal GQA attention over 520 ragged keys (D=128) and a masked one (D=64),
    each at the producer forms of its space: turns or not, 2 to 4 stages."""
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
    template, found = FlashAttentionTemplate(), []
    for hq, hkv, s, d, causal, mask in ((4, 2, 520, 128, True, None), (2, 2, 384, 64, False, DType.bool)):
        q, kv = TensorType((2, hq, s, d), BF16), TensorType((2, hkv, s, d), BF16)
        operands = (q, kv, kv) + ((TensorType((2, 1, s, s), mask),) if mask else ())
        op = KernelOp.of("flash_attention", operands, q, scale=d ** -0.5, causal=causal, has_mask=mask is not None)
        forms = tuple(s for s in template.space(op, arch) if getattr(s, "producer", False))
        if forms:
            found.append((op, forms))
    return found


def check_op(op, arch, schedules=None) -> int:
    """Each of `schedules` (default: every default schedule of `op`) once, against its float64
    reference: how many are wrong."""
    import numpy as np
    from tessera_rw.codegen.kernel_check import KernelMismatchError, check, expected
    from tessera_rw.codegen.kernel_inputs import random_inputs
    from tessera_rw.codegen.templates.registry import templates_for
    template, wrong = templates_for(op)[0], 0
    for schedule in schedules if schedules is not None else template.schedules(op, arch):
        rng = np.random.default_rng(0)
        inputs = random_inputs(op, rng)
        reference = expected(op, inputs, rng).on(template.resources(op, schedule, arch).unit)
        what = f"{op.op}{' (fast)' if op.numerics.value == 'fast' else ''} [{schedule.describe()}]"
        try:
            check(reference, run_poisoned(op, list(inputs.arrays), schedule), what)
            print(f"{what}: ok", flush=True)
        except KernelMismatchError as e:
            wrong += 1
            print(f"{what}: WRONG {str(e).splitlines()[0]}", flush=True)
    return wrong


def run(kernels: str = "all") -> int:
    """Check `kernels` ("all", "rows", "backward", "cross-block", "views" or "variants"); 1 when any is
    wrong."""
    reason = preflight()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.templates.registry import templates_for
    arch, wrong = current_arch(), 0
    rows = small_rows() if kernels in ("all", "rows") else []
    precompile(list(kernels_to_compile(rows, arch, quick=False)), arch)
    for row in rows:
        schedules = row_schedules(row, arch, quick=False)
        if not schedules:
            print(f"{row.name}: skipped ({templates_for(row.op)[0].unavailable(row.op, arch)})")
            continue
        inputs = row.make()
        ref = row.reference(*inputs)
        for schedule in schedules:
            error = rel_error(run_poisoned(row.op, inputs, schedule), ref)
            ok = error <= TOLERANCE[row.op.result.dtype]
            wrong += not ok
            print(f"{row.name.split(' vs ')[0]} [{schedule.describe()}]: error {error:.1e} {'ok' if ok else 'WRONG'}",
                  flush=True)
    ops = ((backward_ops() if kernels in ("all", "backward") else [])
           + (cross_block_ops() if kernels in ("all", "cross-block") else [])
           + (view_ops() if kernels in ("all", "views") else []))
    for op in ops:
        wrong += check_op(op, arch)
    for op, schedules in variant_ops(arch) if kernels in ("all", "variants") else []:
        wrong += check_op(op, arch, schedules)
    return 1 if wrong else 0
