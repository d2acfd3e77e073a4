"""Ops small enough for the CPU emulator that together take every code path the templates' samples
take: each sample's kind of problem (epilogue, dtype, mask, causal, GQA, row length class, reduced
axes, copy pattern, convolution family) at sizes of a few million multiply-adds, with ragged edges
where a sample has them. The ragged ops (ragged_ops.RAGGED) and the attention ops
(emulated_attention_ops.py) are included as they are.

>>> len(EMULATED) > 80
True
>>> from tests.codegen.shipped import shipped_templates
>>> covered = {type(t).__name__ for op in EMULATED.values() for t in shipped_templates() if t.accepts(op)}
>>> sorted({type(t).__name__ for t in shipped_templates() if t.library is None} - covered)
[]
"""

from __future__ import annotations

from dataclasses import replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import read_as
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.spectral import spectral_op
from tests.codegen.emulated_attention_ops import ATTENTION_OPS
from tests.codegen.emulated_conv_ops import CONV_OPS
from tests.codegen.emulated_pre_act_ops import PRE_ACT_OPS
from tests.codegen.emulated_index_ops import INDEX_OPS
from tests.codegen.emulated_multi_reduction_ops import MULTI_REDUCTION_OPS
from tests.codegen.emulated_pool_ops import POOL_OPS
from tests.codegen.emulated_row_sum_ops import ROW_SUM_OPS
from tests.codegen.emulated_view_ops import VIEW_OPS
from tests.codegen.ragged_ops import RAGGED, matmul, of

BF16, F16, F32, BOOL = DType.bfloat16, DType.float16, DType.float32, DType.bool
E4M3, E5M2 = DType.float8_e4m3, DType.float8_e5m2
FAST, KAHAN = Numerics.FAST, Numerics.KAHAN_SUM


def under(numerics: Numerics | None, op: KernelOp) -> KernelOp:
    """`op` under the numerics policy `numerics` (None: as built)."""
    return op if numerics is None else replace(op, numerics=numerics)


def gemm(a, b, dtype, out, extra=(), numerics=None, **attrs) -> KernelOp:
    attrs = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                 dtype=out) | attrs
    return under(numerics, of("gemm", TensorType(a, dtype), TensorType(b, dtype),
                              *(TensorType(s, d) for s, d in extra), **attrs))


def bias_grad(m, k, n, dtype, numerics=None) -> KernelOp:
    return under(numerics, of("matmul_bias_grad", TensorType((m, k), dtype), TensorType((k, n), dtype),
                              accum_dtype=None))


def stored(shape, dtype, transposed) -> TensorType:
    """An operand the product reads at `shape`, as it lies in memory (last two axes swapped when
    `transposed`: swapping is its own inverse)."""
    return read_as(TensorType(shape, dtype), transposed)


def transposed(a, b, dtype, out, trans_a=False, trans_b=False, extra=(), numerics=None, **attrs) -> KernelOp:
    """A gemm of the product a @ b (shapes as the product reads them) with operands stored transposed."""
    attrs = dict(scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                 dtype=out, trans_a=trans_a, trans_b=trans_b) | attrs
    return under(numerics, of("gemm", stored(a, dtype, trans_a), stored(b, dtype, trans_b),
                              *(TensorType(s, d) for s, d in extra), **attrs))


def bias_grad_transposed(m, k, n, dtype, numerics=None) -> KernelOp:
    """[Aᵀ; 1ᵀ] B with A stored [K, M], as a weight gradient's Xᵀ is."""
    return under(numerics, of("matmul_bias_grad", stored((m, k), dtype, True), TensorType((k, n), dtype),
                              accum_dtype=None, trans_a=True))


def rowwise(name, rows, cols, dtype, numerics=None, weights=True) -> KernelOp:
    x, w = TensorType((rows, cols), dtype), TensorType((cols,), dtype)
    if name in ("softmax", "log_softmax"):
        return under(numerics, of(name, x, axis=1))
    params = ((w, w) if name == "layernorm" else (w,)) if weights else ()
    return under(numerics, of(name, x, *params, axes=(1,), eps=1e-5, has_weight=weights,
                              has_bias=weights and name == "layernorm"))


def norm_backward(norm, rows, cols, dtype, numerics=None, weights=True, residual=False, stats=False,
                  parts=0) -> KernelOp:
    """norm_backward (norm_backward_stats with `stats`: each row's statistics after dx;
    norm_backward_grads with `parts`: the weight's and bias's gradient partials)."""
    x, w = TensorType((rows, cols), dtype), TensorType((cols,), dtype)
    name, extra = ("norm_backward_grads", {"parts": parts}) if parts else \
        ("norm_backward_stats" if stats else "norm_backward", {})
    return under(numerics, of(name, x, x, *((w,) if weights else ()), *((x,) if residual else ()), norm=norm,
                              axes=(1,), eps=1e-5, has_weight=weights, has_residual=residual, **extra))


def reduce(name, shape, dtype, axes, keepdims=False, numerics=None) -> KernelOp:
    return under(numerics, of(name, TensorType(shape, dtype), axes=axes, keepdims=keepdims))


def _gemm_ops() -> dict[str, KernelOp]:
    return {
        "matmul 256x256x256 bf16": matmul((256, 256), (256, 256), BF16),
        "gemm bias gelu 160x256x96 bf16": gemm((160, 96), (96, 256), BF16, BF16, [((256,), BF16)],
                                              has_bias=True, activation="gelu"),
        "gemm f16 -> f32 residual scale": gemm((128, 192), (192, 136), F16, F32, [((128, 136), F32)],
                                              has_residual=True, scale=0.5),
        "matmul batched broadcast 4x96x64 @ 64x160 bf16": matmul((4, 96, 64), (64, 160), BF16),
        "matmul 130x70x90 f32 simt": matmul((130, 90), (90, 70), F32),
        "matmul 128x128x64 f32 simt": matmul((128, 64), (64, 128), F32),
        "matmul 256x128x64 tf32": under(FAST, matmul((256, 64), (64, 128), F32)),
        "matmul 3x101x99x103 tf32 ragged": under(FAST, matmul((3, 101, 99), (99, 103), F32)),
        "gemm bias gelu_tanh tf32": gemm((96, 64), (64, 160), F32, F32, [((160,), F32)], FAST, has_bias=True,
                                         activation="gelu_tanh"),
        "gemm dgelu bf16": gemm((128, 96), (96, 256), BF16, BF16, [((128, 256), BF16)], activation="dgelu"),
        "gemm dsilu batched f16": gemm((2, 64, 128), (128, 96), F16, F16, [((2, 64, 96), F16)], activation="dsilu"),
        "gemm drelu 100x100 f32 simt": gemm((100, 100), (100, 100), F32, F32, [((100, 100), F32)],
                                            activation="drelu"),
        "gemm dgelu_tanh tf32": gemm((128, 64), (64, 128), F32, F32, [((128, 128), F32)], FAST,
                                     activation="dgelu_tanh"),
        "bias grad 128x64x128 bf16": bias_grad(128, 64, 128, BF16),
        "bias grad 100x99x103 f16 ragged": bias_grad(100, 99, 103, F16),
        "bias grad 50x77x30 f32 simt": bias_grad(50, 77, 30, F32),
        "bias grad 64x128x64 tf32": bias_grad(64, 128, 64, F32, FAST),
    }


def _transposed_gemm_ops() -> dict[str, KernelOp]:
    """Operands stored transposed, on every path: aligned rows (cp.async) and ragged ones
    (element-wise copies), the bias gradient's ones column mid-tile and past a tile, batched and
    broadcast."""
    return {
        "gemm nt dgelu 128x256x96 bf16": transposed((128, 96), (96, 256), BF16, BF16, trans_b=True,
                                                    extra=[((128, 256), BF16)], activation="dgelu"),
        "gemm tn bias gelu 160x256x96 bf16": transposed((160, 96), (96, 256), BF16, BF16, trans_a=True,
                                                        extra=[((256,), BF16)], has_bias=True, activation="gelu"),
        "gemm tt batched broadcast f16": transposed((2, 64, 128), (128, 96), F16, F16, trans_a=True, trans_b=True),
        "gemm tn ragged 101x103x99 bf16 -> f32": transposed((101, 99), (99, 103), BF16, F32, trans_a=True),
        "gemm nt ragged 3x101x103x99 f16": transposed((3, 101, 99), (99, 103), F16, F16, trans_b=True),
        "matmul tn 256x128x64 tf32": transposed((256, 64), (64, 128), F32, F32, trans_a=True, numerics=FAST),
        "matmul nt 3x101x103x99 tf32 ragged": transposed((3, 101, 99), (99, 103), F32, F32, trans_b=True,
                                                         numerics=FAST),
        "matmul tt 96x160x64 tf32": transposed((96, 64), (64, 160), F32, F32, True, True, numerics=FAST),
        "matmul tn ragged 61x70x50 tf32": transposed((61, 50), (50, 70), F32, F32, trans_a=True, numerics=FAST),
        "gemm tt 130x70x90 f32 simt": transposed((130, 90), (90, 70), F32, F32, True, True),
        "gemm tn batched 2x100x100x60 f32 simt": transposed((2, 100, 60), (60, 100), F32, F32, trans_a=True),
        # (X W + b)ᵀ as the GEMM of the swapped operands: broadcast A, batched B, a bias per row
        "gemm tt row bias batched B f32 simt": transposed((48, 32), (2, 32, 40), F32, F32, True, True,
                                                          extra=[((48, 1), F32)], has_bias=True),
        "gemm tt row bias gelu batched B bf16": transposed((64, 32), (2, 32, 72), BF16, BF16, True, True,
                                                           extra=[((64, 1), BF16)], has_bias=True, activation="gelu"),
        "bias grad tn 128x64x128 bf16": bias_grad_transposed(128, 64, 128, BF16),
        "bias grad tn 72x64x128 bf16": bias_grad_transposed(72, 64, 128, BF16),
        "bias grad tn 100x99x103 f16 ragged": bias_grad_transposed(100, 99, 103, F16),
        "bias grad tn 50x77x30 f32 simt": bias_grad_transposed(50, 77, 30, F32),
        "bias grad tn 64x128x64 tf32": bias_grad_transposed(64, 128, 64, F32, FAST),
        "bias grad tn 61x70x50 tf32 ragged": bias_grad_transposed(61, 70, 50, F32, FAST),
    }


def _fp8_gemm_ops() -> dict[str, KernelOp]:
    """fp8 operands in every layout: B stored [N, K] read as it lies, B stored [K, N] or A stored
    [K, M] transposed through registers (one such operand overlapped with the MMAs, two written as
    they land), aligned rows (vector loads, cp.async) and ragged ones (byte by byte). K runs to
    several 64-deep tiles, so the main loop refills stages (and a ragged K ends inside it)."""
    return {
        "gemm fp8 nt 128x256x128 e4m3": transposed((128, 128), (128, 256), E4M3, BF16, trans_b=True),
        "gemm fp8 nn bias gelu 160x256x192 e4m3": transposed((160, 192), (192, 256), E4M3, BF16,
                                                            extra=[((256,), BF16)], has_bias=True, activation="gelu"),
        "gemm fp8 tn batched scale e5m2 -> f32": transposed((2, 96, 320), (320, 160), E5M2, F32, trans_a=True,
                                                           scale=0.25),
        "gemm fp8 tt broadcast e4m3 -> f16": transposed((2, 64, 352), (352, 96), E4M3, F16, True, True),
        "gemm fp8 nt ragged 101x103x333 e4m3": transposed((101, 333), (333, 103), E4M3, BF16, trans_b=True),
        "gemm fp8 nn ragged 3x101x103x99 e5m2": transposed((3, 101, 99), (99, 103), E5M2, BF16),
        "gemm fp8 tn ragged residual e4m3 -> f32": transposed((70, 317), (317, 130), E4M3, F32, trans_a=True,
                                                             extra=[((70, 130), F32)], has_residual=True),
        "gemm fp8 tt ragged 33x130x203 e5m2": transposed((33, 203), (203, 130), E5M2, BF16, True, True),
    }


def _wgmma_gemm_ops() -> dict[str, KernelOp]:
    """Products long enough in K (8-9 tiles) that sm_90's warpgroup-MMA kernels refill every stage
    of their pipeline while earlier tiles' MMAs are in flight, in each operand layout, with ragged
    rows (copied element by element), a K tail inside the last tile, and a bias gradient's ones row."""
    return {
        "gemm wgmma nn long k 72x136x520 bf16": transposed((72, 520), (520, 136), BF16, BF16),
        "gemm wgmma tt long k batched 2x64x200x456 f16 -> f32": transposed((2, 64, 456), (456, 200), F16, F32,
                                                                           trans_a=True, trans_b=True),
        "gemm wgmma tn ragged long k 70x130x450 bf16 bias": transposed((70, 450), (450, 130), BF16, BF16, trans_a=True,
                                                                       extra=[((130,), BF16)], has_bias=True),
        "gemm wgmma nt long k 96x144x1040 e4m3 -> f32": transposed((96, 1040), (1040, 144), E4M3, F32, trans_b=True),
        "bias grad tn wgmma long k 72x520x136 bf16": bias_grad_transposed(72, 520, 136, BF16),
    }


def _rowwise_ops() -> dict[str, KernelOp]:
    short, scale, mask = TensorType((64, 512), F32), TensorType((), F32), TensorType((1, 512), F32)
    hid, w = TensorType((32, 768), BF16), TensorType((768,), BF16)
    return {
        "softmax rows of 8192 bf16": rowwise("softmax", 4, 8192, BF16),
        "log_softmax rows of 512 f32": rowwise("log_softmax", 64, 512, F32),
        "layernorm rows of 768 bf16": rowwise("layernorm", 32, 768, BF16),
        "rmsnorm rows of 4096 bf16": rowwise("rmsnorm", 8, 4096, BF16),
        "softmax rows of 65536 f32": rowwise("softmax", 2, 65536, F32),
        "layernorm rows of 65536 bf16 no weights": rowwise("layernorm", 2, 65536, BF16, weights=False),
        # rows of one element: every lane but the first holds the neutral value
        "softmax rows of 1 f32": rowwise("softmax", 64, 1, F32),
        "rmsnorm rows of 1 bf16": rowwise("rmsnorm", 32, 1, BF16),
        "layernorm rows of 3 f32": rowwise("layernorm", 16, 3, F32),
        "fused scale mask softmax": of("fused_normalization", short, scale, mask, expr="add(mul($0,$1),$2)",
                                       norm="softmax", axes=(1,), eps=0.0, has_weight=False, has_bias=False,
                                       post="$0"),
        "fused residual layernorm gate": of("fused_normalization", hid, hid, w, w, hid, expr="add($0,$1)",
                                            norm="layernorm", axes=(1,), eps=1e-5, has_weight=True,
                                            has_bias=True, post="mul($0,sigmoid($1))"),
        "softmax rows of 8192 bf16 kahan": rowwise("softmax", 4, 8192, BF16, KAHAN),
        "log_softmax rows of 512 f32 kahan": rowwise("log_softmax", 64, 512, F32, KAHAN),
        "layernorm rows of 768 bf16 kahan": rowwise("layernorm", 32, 768, BF16, KAHAN),
        "rmsnorm rows of 4096 bf16 kahan": rowwise("rmsnorm", 8, 4096, BF16, KAHAN),
        "softmax rows of 65536 f32 kahan": rowwise("softmax", 2, 65536, F32, KAHAN),
        "layernorm rows of 65536 f32 kahan": rowwise("layernorm", 2, 65536, F32, KAHAN, weights=False),
        # the input gradients: resident (block and warp per row, ragged), looped
        "layernorm backward rows of 768 bf16": norm_backward("layernorm", 32, 768, BF16),
        "rmsnorm backward rows of 4096 bf16": norm_backward("rmsnorm", 8, 4096, BF16),
        "layernorm backward rows of 100 f32 no weight": norm_backward("layernorm", 48, 100, F32, weights=False),
        "rmsnorm backward rows of 3 f16": norm_backward("rmsnorm", 16, 3, F16),
        "layernorm backward rows of 65536 f32": norm_backward("layernorm", 2, 65536, F32),
        "rmsnorm backward rows of 65536 bf16 no weight": norm_backward("rmsnorm", 2, 65536, BF16, weights=False),
        "layernorm backward rows of 768 bf16 kahan": norm_backward("layernorm", 32, 768, BF16, KAHAN),
        "layernorm backward rows of 65536 f32 kahan": norm_backward("layernorm", 2, 65536, F32, KAHAN),
        "layernorm backward plus residual rows of 100 bf16": norm_backward("layernorm", 24, 100, BF16, residual=True),
        "layernorm backward with its statistics rows of 768 bf16": norm_backward("layernorm", 32, 768, BF16,
                                                                                 stats=True),
        "layernorm backward with its statistics rows of 30 bf16 (aligning gaps)": norm_backward(
            "layernorm", 45, 30, BF16, stats=True),
        "layernorm backward with its statistics rows of 100 f32 no weight": norm_backward(
            "layernorm", 48, 100, F32, weights=False, stats=True),
        "rmsnorm backward with its statistics plus residual rows of 65536 f32": norm_backward(
            "rmsnorm", 2, 65536, F32, residual=True, stats=True),
        "layernorm backward with its statistics rows of 65536 bf16 kahan": norm_backward(
            "layernorm", 2, 65536, BF16, KAHAN, stats=True),
        "rmsnorm backward plus residual rows of 65536 f32": norm_backward("rmsnorm", 2, 65536, F32, weights=False,
                                                                          residual=True),
        # and with the weight's and bias's gradient partials: rows not a multiple of the parts, ragged
        "layernorm backward with its weight gradients rows of 4096 bf16": norm_backward("layernorm", 37, 4096, BF16,
                                                                                        parts=8),
        "layernorm backward with its weight gradients rows of 768 bf16": norm_backward("layernorm", 40, 768, BF16,
                                                                                       parts=40),
        "rmsnorm backward with its weight gradients plus residual rows of 100 f32": norm_backward(
            "rmsnorm", 30, 100, F32, residual=True, parts=7),
        "layernorm backward with its bias gradient rows of 3 f16": norm_backward("layernorm", 20, 3, F16,
                                                                                 weights=False, parts=3),
        "layernorm backward with its weight gradients rows of 2048 bf16 kahan": norm_backward(
            "layernorm", 16, 2048, BF16, KAHAN, parts=5),
    }


def _reduction_ops() -> dict[str, KernelOp]:
    return {
        "sum rows of 4096 bf16": reduce("sum", (64, 4096), BF16, (1,)),
        "mean rows of 512 f32 keepdims": reduce("mean", (256, 512), F32, (1,), True),
        "max columns of 256 bf16": reduce("max", (4096, 256), BF16, (0,)),
        "sum columns int32 -> int64": reduce("sum", (512, 256), DType.int32, (0,)),
        "sum two reduced groups f32": reduce("sum", (4, 256, 64), F32, (0, 2)),
        "min middle axis keepdims f32": reduce("min", (8, 128, 64), F32, (1,), True),
        "sum rows of 4096 bf16 kahan": reduce("sum", (64, 4096), BF16, (1,), numerics=KAHAN),
        "mean rows of 512 f32 kahan": reduce("mean", (256, 512), F32, (1,), True, numerics=KAHAN),
        "sum columns f32 kahan": reduce("sum", (4096, 256), F32, (0,), numerics=KAHAN),
        "sum two reduced groups f32 kahan": reduce("sum", (4, 256, 64), F32, (0, 2), numerics=KAHAN),
        "sum of 262144 f32 kahan": reduce("sum", (1 << 18,), F32, (0,), numerics=KAHAN),
        # few outputs: blocks share each one (a grid split), meeting in a workspace
        "sum to a scalar bf16": reduce("sum", (4, 64, 768), BF16, (0, 1, 2)),
        "max of 100003 f32": reduce("max", (100003,), F32, (0,)),
        "mean rows of 65536 f16": reduce("mean", (2, 65536), F16, (1,)),
        "sum rows of 40000 int32": reduce("sum", (3, 40000), DType.int32, (1,)),
        "max rows f32 kahan": reduce("max", (64, 4096), F32, (1,), numerics=KAHAN),
        "fused sum rows dy*w*x bf16": fused_reduce((((64, 1000), BF16), ((1000,), BF16), ((64, 1000), BF16)),
                                                   "mul(mul($0,$1),$2)", "sum", (1,), True),
        "fused sum columns dy*(x-m)*r bf16": fused_reduce(
            (((300, 200), BF16), ((300, 1), F32), ((300, 1), F32), ((300, 200), BF16)),
            "mul(mul(sub($0,$1),$2),$3)", "sum", (0,)),
        "fused mean of a squared difference f32": fused_reduce((((96, 40), F32), ((96, 40), F32)),
                                                               "mul(sub($0,$1),sub($0,$1))", "mean", (0, 1)),
        "fused loss over 256x1024 bf16, grid split": fused_reduce((((256, 1024), BF16), ((256, 1024), BF16)),
                                                                  "mul($0,$1)", "sum", (0, 1)),
        "fused max rows f16 kahan": under(KAHAN, fused_reduce((((32, 512), F16), ((32, 512), F16)),
                                                              "add($0,$1)", "max", (1,))),
        "fused sum rows f32 kahan": under(KAHAN, fused_reduce((((32, 3000), F32), ((32, 1), F32)),
                                                              "exp(sub($0,$1))", "sum", (1,), True)),
        "fused sum rows f64": fused_reduce((((16, 300), DType.float64), ((300,), DType.float64)),
                                           "add(mul($0,$1),$0)", "sum", (1,)),
        "fused max columns int32": fused_reduce((((64, 40), DType.int32), ((64, 40), DType.int32)),
                                                "add($0,$1)", "max", (0,)),
    }


def fused_reduce(shapes_dtypes, expr, reduce_, axes, keepdims=False) -> KernelOp:
    return of("fused_reduction", *(TensorType(s, d) for s, d in shapes_dtypes), expr=expr, reduce=reduce_,
              axes=axes, keepdims=keepdims)


def _elementwise_ops() -> dict[str, KernelOp]:
    big, row, col = TensorType((256, 512), BF16), TensorType((512,), BF16), TensorType((256, 1), BF16)
    x32 = TensorType((256, 384), F32)
    return {
        "add bias broadcast bf16": of("add", big, row),
        "mul by scalar f32": of("mul", x32, TensorType((), F32)),
        "exp f32": of("exp", x32),
        "relu int32 keeps its type": of("relu", TensorType((96, 40), DType.int32)),
        "gelu tanh bf16": of("gelu", big, approximate="tanh"),
        "gelu f32": of("gelu", x32, approximate="none"),
        "sub inner broadcast bf16": of("sub", big, col),
        "where masked fill": of("where", TensorType((1, 1, 64, 64), BOOL), TensorType((2, 4, 64, 64), BF16),
                                TensorType((), BF16)),
        "cast f32 -> bf16": of("cast", x32, dtype=BF16),
        "cast e4m3 -> bf16": of("cast", TensorType((256, 512), E4M3), dtype=BF16),
        "e5m2 times f32 bias": of("mul", TensorType((256, 384), E5M2), TensorType((384,), F32)),
        "lt broadcast f32": of("lt", x32, TensorType((384,), F32)),
        "logical_and bool": of("logical_and", TensorType((256, 512), BOOL), TensorType((256, 512), BOOL)),
        "tril bf16": of("tril", big, k=0),
        "fused relu(add) * y": of("fused_elementwise", big, row, big, expr="mul(relu(add($0,$1)),$2)"),
        "multi_elementwise: two results, one broadcast bf16": of("multi_elementwise", big, row,
                                                                  exprs="add($0,$1);mul(exp($1),$0)"),
        "fused gelu(add) * gelu_tanh(y) bf16": of("fused_elementwise", big, row, big,
                                                  expr="mul(gelu(add($0,$1)),gelu_tanh($2))"),
        "fused upcast, scale, downcast bf16": of(
            "fused_elementwise", big, expr="cast_bfloat16(add(mul(cast_float32($0),2.0:float32),1.0:float32))"),
        "full bf16": KernelOp.of("full", (), TensorType((256, 512), BF16), shape=(256, 512), value=1.5, dtype=BF16),
        "arange f32": KernelOp.of("arange", (), TensorType((65536,), F32), start=0, stop=65536, step=1, dtype=F32),
    }


def _copy_ops() -> dict[str, KernelOp]:
    return {
        "transpose 512x512 bf16": of("transpose", TensorType((512, 512), BF16), axes=(1, 0)),
        "transpose heads f32": of("transpose", TensorType((2, 64, 12, 64), F32), axes=(0, 2, 1, 3)),
        "transpose batched ragged f32": of("transpose", TensorType((3, 100, 70), F32), axes=(0, 2, 1)),
        "pad columns bf16": of("pad", TensorType((64, 1000), BF16), pads=((0, 0), (8, 16)), value=0.0),
        "pad image f32": of("pad", TensorType((2, 3, 30, 30), F32), pads=((0, 0), (0, 0), (1, 1), (1, 1)),
                            value=-1.0),
        "concatenate columns bf16": of("concatenate", TensorType((128, 256), BF16), TensorType((128, 128), BF16),
                                       axis=1),
        "strided row slice f32": of("slice", TensorType((256, 512), F32), starts=(0, 128), stops=(256, 384),
                                    steps=(2, 1)),
        "strided column slice bf16": of("slice", TensorType((128, 512), BF16), starts=(0, 0), stops=(128, 512),
                                        steps=(1, 2)),
        "broadcast_to rows bf16": of("broadcast_to", TensorType((1, 512), BF16), shape=(128, 512)),
        # k of a fused q|k|v projection with its heads brought forward (a folded slice + transpose)
        "strided_copy k heads bf16": of("strided_copy", TensorType((2, 64, 192), BF16), shape=(2, 4, 64, 16),
                                        strides=(64 * 192, 16, 192, 1), offset=64),
        "strided_copy ragged f32": of("strided_copy", TensorType((5, 37), F32), shape=(3, 2, 7),
                                      strides=(37, 12, 1), offset=3),
        "strided_concatenate dq dk dv bf16": of("strided_concatenate", *(TensorType((2, 4, 64, 16), BF16),) * 3,
                                                axis=2, shape=(2, 64, 3, 4, 16), sizes=(1, 1, 1),
                                                strides=(4096, 16, 1, 1024, 1) * 3, offsets=(0, 0, 0)),
        "strided_concatenate ragged f32": of("strided_concatenate", TensorType((7, 9), F32), TensorType((40,), F32),
                                             axis=1, shape=(3, 5), sizes=(2, 3), strides=(9, 1, 5, 1), offsets=(1, 4)),
        # one piece: the operand chosen without a test
        "concatenate of one piece f32": of("concatenate", TensorType((3, 40), F32), axis=0),
        "strided_concatenate of one piece f32": of("strided_concatenate", TensorType((50,), F32), axis=0, shape=(4,),
                                                   sizes=(4,), strides=(1,), offsets=(13,)),
        "flip columns bf16": of("flip", TensorType((96, 250), BF16), axes=(1,)),
        "flip outer axes f32": of("flip", TensorType((3, 50, 64), F32), axes=(0, 1)),
        "flip every axis f32": of("flip", TensorType((6, 7, 10), F32), axes=(0, 1, 2)),
        "transpose 192x160 e4m3": of("transpose", TensorType((192, 160), DType.float8_e4m3), axes=(1, 0)),
        "pad rows e5m2": of("pad", TensorType((40, 64), DType.float8_e5m2), pads=((3, 5), (0, 0)), value=-1.5),
    }


def _spectral_ops() -> dict[str, KernelOp]:
    return {
        "spectral contract 1-d": spectral_op((4, 16, 129), (16, 16, 129)),
        "spectral contract 2-d grouped": spectral_op((2, 16, 12, 7), (32, 4, 12, 7), groups=4),
    }


def _plugin_ops() -> dict[str, KernelOp]:
    """The example plugin's kernel (tessera_rw_rmsnorm_matmul, installed with the test extras)."""
    def rmsnorm_matmul(lead, k, n, dtype):
        x, g, w = TensorType(lead + (k,), dtype), TensorType((k,), dtype), TensorType((k, n), dtype)
        return KernelOp.of("rmsnorm_matmul", (x, g, w), TensorType(lead + (n,), dtype), eps=1e-6)
    return {"plugin rmsnorm_matmul f32 ragged": rmsnorm_matmul((3, 37), 70, 45, F32),
            "plugin rmsnorm_matmul bf16": rmsnorm_matmul((2, 64), 96, 64, BF16)}


EMULATED: dict[str, KernelOp] = (RAGGED | _gemm_ops() | _transposed_gemm_ops() | _fp8_gemm_ops() | _wgmma_gemm_ops()
                                  | PRE_ACT_OPS | ATTENTION_OPS | _rowwise_ops() | ROW_SUM_OPS | _reduction_ops()
                                  | _elementwise_ops() | VIEW_OPS | _copy_ops() | CONV_OPS | _spectral_ops()
                                  | INDEX_OPS | MULTI_REDUCTION_OPS | POOL_OPS | _plugin_ops())
