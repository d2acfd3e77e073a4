"""Direct convolution (conv1d / conv2d) as an implicit GEMM over a gathered input.

Per group g the convolution is a matrix product  Y[m, o] = Σ_k A[m, k] · B[k, o]  with
m = (image, output position), o = output channel, k = (input channel, kernel tap):
A[m, k] = x[image, g·C/g + c, oh·s + kh·d - pad, ...] (zero outside the input) is never
materialized, each block gathers its A tile straight into shared memory; B[k, o] = w[g·O/g + o, k]
is w as stored. 16-bit inputs run on tensor cores (mma.sync m16n8k16, fp32 accumulators); fp32
runs a SIMT FFMA tile. conv1d is conv2d with a height of one, which the constants fold away.

A depthwise convolution (one input channel per group, any channel multiplier) would leave that GEMM
one output channel wide, so it runs the sliding-window kernel of conv_depthwise.py instead.

Both kernels write a fused_conv's epilogue as they store (conv_epilogue.py), and the implicit GEMM
reads a strided_conv's x and w through their views (conv_operand_views.py).

>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> x, w = TensorType((16, 64, 2048), DType.bfloat16), TensorType((64, 64, 3), DType.bfloat16)
>>> op = KernelOp.of("conv1d", (x, w), TensorType((16, 64, 2048), DType.bfloat16),
...                  stride=(1,), padding=((1, 1),), dilation=(1,), groups=1)
>>> DirectConvTemplate().schedules(op, arch_named("h100"))[0].describe()
'bm=128 bn=64 bk=32 warps_m=4 warps_n=2'
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import ArchSpec, MathUnit, WARP_SIZE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.conv_cuda import implicit_gemm_source
from tessera_rw.codegen.templates.conv_epilogue import (ConvEpilogue, epilogue_flops, launch_operands,
                                                          with_epilogue)
from tessera_rw.codegen.templates.conv_depthwise import (DepthwiseSchedule, depthwise_emit, depthwise_fits,
                                                         depthwise_resources, depthwise_schedules)
from tessera_rw.codegen.templates.conv_operand_views import restrided
from tessera_rw.codegen.templates.conv_problem import (MAX_GRID_YZ, STATIC_SMEM_LIMIT, TENSOR_CORE_DTYPES,
                                                       ConvProblem, cdiv, conv_op, conv_operands, pow2,
                                                       strided_conv_op, swapped_leading)
from tessera_rw.codegen.templates.conv_space import depthwise_grid, implicit_gemm_grid

_MMA_M, _MMA_N, _MMA_K = 16, 8, 16       # mma.sync m16n8k16
_SIMT_LANES_M, _SIMT_LANES_N = 8, 4      # a warp's 32 lanes as an 8 x 4 grid of output micro-tiles
_MMA_SMEM_PAD = 8                        # halves per row: 16-byte rows, conflict-free fragment loads
_SIMT_SMEM_PAD = 1                       # floats per B row: breaks the power-of-two stride of the stores
# Registers besides the tile: row origin, image and weight bases (64-bit), tap decode, loop counters;
# the mma path also keeps fragment addresses for the two 16-wide k steps of a tile.
_MMA_ADDRESSING, _SIMT_ADDRESSING = 28, 22
_MAX_INDEX = 2**31 - 1                   # in-image offsets and the GEMM row index are 32-bit ints
# Fraction of the unit's peak: the im2col gather (scalar predicated loads, integer address math)
# competes with the math, so a direct conv reaches less than a dense GEMM of the same size.
_MMA_EFFICIENCY = {8: 0.5, 9: 0.4}       # by compute-capability major; sm_90 peak is wgmma's
_SIMT_EFFICIENCY = 0.6
SPLIT_WAVES = 2          # a split K aims for this many blocks per SM, all tiles together
MIN_SPLIT_KTILES = 4     # ... each block walking at least this many k tiles
MAX_SPLIT_K = 64


@dataclass(frozen=True)
class ConvSchedule(Schedule):
    """A block computes a bm x bn tile of (output positions x output channels), bk taps at a time."""
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    split_k: int = 1      # blocks sharing a tile's K, their parts summed in a workspace (conv_cuda.py)

    @property
    def threads(self) -> int:
        return WARP_SIZE * self.warps_m * self.warps_n

    quiet_defaults = frozenset({"split_k"})


# The defaults, best first; the first three that fit the op and the architecture are offered.
_MMA_CANDIDATES = ((128, 64, 32, 4, 2), (64, 64, 32, 2, 2), (128, 128, 32, 4, 2),
                   (128, 32, 32, 4, 1), (64, 16, 32, 4, 1))
_SIMT_CANDIDATES = ((64, 64, 16, 2, 2), (128, 64, 16, 4, 2), (64, 32, 16, 2, 2), (64, 16, 16, 4, 1))


class DirectConvTemplate(Template):
    kind = "conv"
    ops = frozenset({"conv1d", "conv2d", "fused_conv", "strided_conv"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops or ConvEpilogue.refusal(op):
            return False
        x, w = conv_operands(op)
        if not (x.dtype == w.dtype == op.result.dtype and x.dtype in (*TENSOR_CORE_DTYPES, DType.float32)):
            return False  # mixed-precision or float64 convolutions have no kernel here
        cv = ConvProblem.of(op)
        per_image = max(cv.n, 1)                  # an empty batch has nothing to index
        return (max(cv.gemm[0], x.numel // per_image, op.result.numel // per_image, w.numel) <= _MAX_INDEX
                and cv.groups <= MAX_GRID_YZ
                # views are read by the implicit GEMM alone, at 32-bit offsets
                and (op.op != "strided_conv" or not cv.depthwise
                     and max(t.numel for t in op.operands[:2]) <= _MAX_INDEX))

    def refusal(self, op: KernelOp) -> str | None:
        return ConvEpilogue.refusal(op)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        epilogue = ConvEpilogue.of(op)
        return (epilogue.ops if epilogue else ()) + (("strided_read",) if op.op == "strided_conv" else ()) + \
            (("bias_grad",) if op.attr_map.get("bias_grad") else ())

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        cv = ConvProblem.of(op)
        if cv.depthwise and (depthwise := depthwise_schedules(cv, arch)):
            return depthwise
        candidates = _MMA_CANDIDATES if cv.tensor_cores else _SIMT_CANDIDATES
        # a tile wider than the group's output channels (rounded up to a power of two) only pads
        widest = max(16, pow2(cv.og))
        valid = [ConvSchedule(*c) for c in candidates if c[1] <= widest]
        valid = [s for s in valid if self._fits(cv, s, arch)][:3]
        if valid and (split := self._split(cv, valid[0], arch)) > 1:   # too few tiles to fill the GPU
            shared = replace(valid[0], split_k=split)
            valid = [shared] * self._fits(cv, shared, arch) + valid
        return tuple(valid[:3])

    @staticmethod
    def _split(cv: ConvProblem, s: ConvSchedule, arch: ArchSpec) -> int:
        """How many blocks share each tile's K where the tiles are fewer than the SMs: up to
        SPLIT_WAVES blocks per SM in all, never one more (5 tiles split 53 ways are 265 blocks, a
        second wave of one block where 264 fit; 52 ways fit in one), each walking at least
        MIN_SPLIT_KTILES k tiles."""
        tiles = DirectConvTemplate._tiles(cv, s)
        if not tiles or tiles >= arch.sm_count:        # an empty batch has nothing to split
            return 1
        split = min(SPLIT_WAVES * arch.sm_count // tiles, cdiv(cv.gemm[2], s.bk) // MIN_SPLIT_KTILES, MAX_SPLIT_K)
        return max(1, split) if cv.groups * split <= MAX_GRID_YZ else 1

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        cv = ConvProblem.of(op)
        defaults = self.schedules(op, arch)
        if isinstance(defaults[0], DepthwiseSchedule):
            grid = (DepthwiseSchedule(*p) for p in depthwise_grid(cv.oh, cv.ow))
        else:
            grid = (ConvSchedule(*p) for p in implicit_gemm_grid(cv.tensor_cores, max(16, pow2(cv.og))))
        return grid_space(defaults, grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        if isinstance(schedule, DepthwiseSchedule):
            return self.accepts(op) and ConvProblem.of(op).depthwise and depthwise_fits(ConvProblem.of(op), schedule, arch)
        return isinstance(schedule, ConvSchedule) and self.accepts(op) and self._fits(ConvProblem.of(op), schedule, arch)

    def _fits(self, cv: ConvProblem, s: ConvSchedule, arch: ArchSpec) -> bool:
        lanes_m, lanes_n = (_MMA_M, _MMA_N) if cv.tensor_cores else (_SIMT_LANES_M, _SIMT_LANES_N)
        return (s.bm % (s.warps_m * lanes_m) == 0 and s.bn % (s.warps_n * lanes_n) == 0
                and (not cv.tensor_cores or s.bk % _MMA_K == 0)
                # each thread gathers one A row and one B k-column, whole elements per thread
                and s.threads % s.bm == 0 and s.threads % s.bk == 0
                and (s.bm * s.bk) % s.threads == 0 and (s.bn * s.bk) % s.threads == 0
                and s.threads <= arch.max_threads_per_block
                and cdiv(cv.og, s.bn) <= MAX_GRID_YZ and 1 <= s.split_k <= MAX_SPLIT_K
                and cv.groups * s.split_k <= MAX_GRID_YZ and self._workspace(cv, s) < _MAX_INDEX
                and self._smem(cv, s) <= min(arch.smem_per_block, STATIC_SMEM_LIMIT)
                and self._registers(cv, s) <= arch.register_limit(s.threads))

    @staticmethod
    def _tiles(cv: ConvProblem, s: ConvSchedule) -> int:
        """Output tiles of the implicit GEMM, all groups."""
        m, n, _ = cv.gemm
        return cdiv(m, s.bm) * cdiv(n, s.bn) * cv.groups

    @staticmethod
    def _parts_bytes(cv: ConvProblem, s: ConvSchedule) -> int:
        """A split K's fp32 tiles, one per block, at the front of its workspace (0 without a split)."""
        return 0 if s.split_k == 1 else DirectConvTemplate._tiles(cv, s) * s.split_k * s.bm * s.bn * 4

    @staticmethod
    def _workspace(cv: ConvProblem, s: ConvSchedule) -> int:
        """A split K's zeroed workspace: each block's fp32 tile, then an arrival counter per tile."""
        return 0 if s.split_k == 1 else DirectConvTemplate._parts_bytes(cv, s) + 4 * DirectConvTemplate._tiles(cv, s)

    @staticmethod
    def _smem(cv: ConvProblem, s: ConvSchedule) -> int:
        arrival = 4 if s.split_k > 1 else 0                # the block's "last to arrive" flag
        if cv.tensor_cores:
            return (s.bm + s.bn) * (s.bk + _MMA_SMEM_PAD) * cv.dtype.itemsize + arrival
        return s.bk * (s.bm + s.bn + _SIMT_SMEM_PAD) * cv.dtype.itemsize + arrival

    @staticmethod
    def _registers(cv: ConvProblem, s: ConvSchedule) -> int:
        """Accumulators + the next tile prefetched into registers + fragments + gather addressing."""
        acc = s.bm * s.bn // s.threads
        prefetch = (s.bm + s.bn) * s.bk // s.threads      # one register per element, 16-bit or not
        if cv.tensor_cores:
            frags = 4 * (s.bm // s.warps_m // _MMA_M) + 2 * (s.bn // s.warps_n // _MMA_N)
        else:
            frags = s.bm // s.warps_m // _SIMT_LANES_M + s.bn // s.warps_n // _SIMT_LANES_N
        return acc + prefetch + frags + (_MMA_ADDRESSING if cv.tensor_cores else _SIMT_ADDRESSING)

    def resources(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> Resources:
        if isinstance(schedule, DepthwiseSchedule):
            return depthwise_resources(op, schedule, arch)
        assert isinstance(schedule, ConvSchedule)
        cv, s = ConvProblem.of(op), schedule
        m, n, k = cv.gemm
        tiles_m, tiles_n, tiles_k = cdiv(m, s.bm), cdiv(n, s.bn), cdiv(k, s.bk)
        x_bytes, w_bytes = (t.nbytes for t in conv_operands(op))
        epilogue = ConvEpilogue.of(op)
        # x is streamed once per output-channel tile (blockIdx.x walks the rows first); halo re-reads
        # of neighbouring rows and those per-tile passes hit L2 while x fits in half of it.
        x_traffic = x_bytes * (tiles_n if x_bytes > arch.l2_bytes // 2 else 1)
        w_traffic = w_bytes * (tiles_m if w_bytes > arch.l2_bytes // 2 else 1)
        registers = self._registers(cv, s)
        limit = arch.register_limit(s.threads)
        if cv.tensor_cores:
            unit, efficiency = MathUnit.BF16, _MMA_EFFICIENCY.get(arch.compute_capability[0], _MMA_EFFICIENCY[9])
        else:
            unit, efficiency = MathUnit.FP32, _SIMT_EFFICIENCY
        parts = 2 * self._workspace(cv, s)               # written by every block, read by the last
        return Resources(
            threads=s.threads, blocks=tiles_m * tiles_n * cv.groups * s.split_k, registers=registers,
            smem_bytes=self._smem(cv, s),
            hbm_bytes=x_traffic + w_traffic + op.result.nbytes + parts + (epilogue.bytes_read if epilogue else 0),
            flops=2 * tiles_m * s.bm * tiles_n * s.bn * tiles_k * s.bk * cv.groups + epilogue_flops(op),
            unit=unit, efficiency=efficiency, spill_bytes=4 * max(0, registers - limit))

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        cv = ConvProblem.of(op)
        if isinstance(schedule, DepthwiseSchedule):
            return depthwise_emit(op, cv, schedule)
        assert isinstance(schedule, ConvSchedule)
        s = schedule
        name = f"conv_{'mma' if cv.tensor_cores else 'simt'}_{s.bm}x{s.bn}x{s.bk}_{s.warps_m}x{s.warps_n}" \
            + (f"_k{s.split_k}" if s.split_k > 1 else "")
        m, n, k = cv.gemm
        work = self._workspace(cv, s)
        grid = (cdiv(m, s.bm), cdiv(n, s.bn), cv.groups * s.split_k)
        header = (f"// {op}\n// schedule: {s.describe()}\n"
                  f"// implicit GEMM per group: M={m} N={n} K={k}, groups={cv.groups}"
                  + (f", K split among {s.split_k} blocks" if s.split_k > 1 else "") + "\n"
                  f"// launch: {name}({launch_operands(op)}{', work' if work else ''}); grid={grid}, "
                  f"block=({s.threads})\n")
        tile = dict(BM=s.bm, BN=s.bn, BK=s.bk, WARPS_M=s.warps_m, WARPS_N=s.warps_n,
                    PAD=_MMA_SMEM_PAD if cv.tensor_cores else _SIMT_SMEM_PAD)
        if s.split_k > 1:
            tile |= dict(SPLITK=s.split_k, WORK_COUNTERS=self._parts_bytes(cv, s))
        suffix = TENSOR_CORE_DTYPES[cv.dtype][1] if cv.tensor_cores else None
        source = restrided(implicit_gemm_source(name, _gemm_sizes(cv), tile, suffix, ConvEpilogue.of(op)),
                           cv.x_view, cv.w_view, cv.kw, cv.n if cv.out_swapped else 0,
                           suffix if cv.bias_grad else False)
        return KernelSource(name, header + source,
                            threads=s.threads, grid=grid, fast_math=op.numerics is Numerics.FAST,
                            workspace_bytes=work)

    def samples(self) -> tuple[KernelOp, ...]:
        bf16, f32 = DType.bfloat16, DType.float32
        resnet = conv_op((8, 64, 56, 56), (64, 64, 3, 3), bf16, padding=((1, 1), (1, 1)))
        return (
            conv_op((16, 64, 2048), (64, 64, 3), bf16, padding=((1, 1),)),
            conv_op((8, 64, 512), (128, 16, 5), f32, padding=((2, 2),), groups=4),
            conv_op((8, 64, 56, 56), (64, 64, 3, 3), bf16, padding=((1, 1), (1, 1))),
            conv_op((4, 32, 28, 28), (64, 32, 3, 3), f32, padding=((1, 1), (1, 1)), stride=(2, 2)),
            # a 3x3 layer's weight gradient as its VJP writes it (x by dY, batch as channels): few
            # output tiles over a long K, which blocks split; bf16 and fp32
            conv_op((64, 32, 58, 58), (64, 32, 56, 56), bf16, padding=((0, 0), (0, 0))),
            conv_op((16, 8, 30, 30), (16, 8, 28, 28), f32, padding=((0, 0), (0, 0))),
            # depthwise: short and long (Hyena-style causal) 1-d kernels, a channel multiplier of 2
            # with stride and dilation (scalar window reads), MobileNet 3x3 and ConvNeXt 7x7
            conv_op((16, 768, 4096), (768, 1, 3), bf16, padding=((1, 1),), groups=768),
            conv_op((16, 768, 2048), (768, 1, 64), bf16, padding=((63, 0),), groups=768),
            conv_op((8, 256, 1000), (512, 1, 5), f32, padding=((4, 4),), stride=(2,), dilation=(2,), groups=256),
            conv_op((8, 128, 56, 56), (128, 1, 3, 3), bf16, padding=((1, 1), (1, 1)), groups=128),
            conv_op((8, 96, 28, 28), (96, 1, 7, 7), f32, padding=((3, 3), (3, 3)), groups=96),
            # epilogues: a ResNet block's two (bias and relu; bias, residual and relu), an fp32 bias and
            # tanh, a MobileNet depthwise layer's bias and relu
            with_epilogue(resnet, "relu(add($0,$1))", ((64, 1, 1), bf16)),
            with_epilogue(resnet, "relu(add(add($0,$1),$2))", ((64, 1, 1), bf16), (resnet.result.shape, bf16)),
            with_epilogue(conv_op((4, 32, 28, 28), (64, 32, 3, 3), f32, padding=((1, 1), (1, 1)), stride=(2, 2)),
                          "tanh(add($0,$1))", ((64, 1, 1), f32)),
            with_epilogue(conv_op((8, 128, 56, 56), (128, 1, 3, 3), bf16, padding=((1, 1), (1, 1)), groups=128),
                          "relu(add($0,$1))", ((128, 1, 1), bf16)),
            # the ResNet layer's weight gradient reading xᵀ and dYᵀ where they lie, writing dW transposed back
            strided_conv_op((8, 64, 58, 58), swapped_leading((8, 64, 58, 58)), (8, 64, 56, 56),
                            swapped_leading((8, 64, 56, 56)), bf16, out_swapped=True),
            # ... and beside it its bias gradient, Σ dY, from one more image of x, all ones
            strided_conv_op((8, 64, 56, 56), swapped_leading((8, 64, 56, 56)), (8, 64, 56, 56),
                            swapped_leading((8, 64, 56, 56)), bf16, out_swapped=True, padding=((1, 1), (1, 1)),
                            bias_grad=True),
        )


def _gemm_sizes(cv: ConvProblem) -> dict[str, int]:
    return {"CV_C": cv.c, "CV_H": cv.h, "CV_W": cv.w, "CV_O": cv.o, "CV_CG": cv.cg, "CV_OG": cv.og,
            "CV_KH": cv.kh, "CV_KW": cv.kw, "CV_OH": cv.oh, "CV_OW": cv.ow, "CV_SH": cv.stride[0],
            "CV_SW": cv.stride[1], "CV_PH": cv.pad[0], "CV_PW": cv.pad[1], "CV_DH": cv.dilation[0],
            "CV_DW": cv.dilation[1], "CV_M": cv.gemm[0]}


