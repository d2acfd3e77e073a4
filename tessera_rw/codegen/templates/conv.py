"""Direct convolution (conv1d / conv2d) as an implicit GEMM over a gathered input.

Per group g the convolution is a matrix product  Y[m, o] = Σ_k A[m, k] · B[k, o]  with
m = (image, output position), o = output channel, k = (input channel, kernel tap):
A[m, k] = x[image, g·C/g + c, oh·s + kh·d - pad, ...] (zero outside the input) is never
materialized, each block gathers its A tile straight into shared memory; B[k, o] = w[g·O/g + o, k]
is w as stored. 16-bit inputs run on tensor cores (mma.sync m16n8k16, fp32 accumulators); fp32
runs a SIMT FFMA tile. conv1d is conv2d with a height of one, which the constants fold away.

A depthwise convolution (one input channel per group, any channel multiplier) would leave that GEMM
one output channel wide, so it runs a sliding-window SIMT kernel instead (DepthwiseSchedule): a block
per (image, output channel, output tile), the tile and its halo staged in shared memory as fp32, each
thread V consecutive outputs of one row with the window held in registers.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.codegen.arch import arch_named
>>> x, w = TensorType((16, 64, 2048), DType.bfloat16), TensorType((64, 64, 3), DType.bfloat16)
>>> op = KernelOp.of("conv1d", (x, w), TensorType((16, 64, 2048), DType.bfloat16),
...                  stride=(1,), padding=((1, 1),), dilation=(1,), groups=1)
>>> DirectConvTemplate().schedules(op, arch_named("h100"))[0].describe()
'bm=128 bn=64 bk=32 warps_m=4 warps_n=2'
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, MathUnit
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.conv_cuda import DepthwiseLayout, depthwise_source, implicit_gemm_source
from tessera_rw.codegen.templates.conv_space import depthwise_grid, implicit_gemm_grid

_TENSOR_CORE_DTYPES = {DType.bfloat16: ("bf16_t", "bf16"), DType.float16: ("f16_t", "f16")}
_MMA_M, _MMA_N, _MMA_K = 16, 8, 16       # mma.sync m16n8k16
_SIMT_LANES_M, _SIMT_LANES_N = 8, 4      # a warp's 32 lanes as an 8 x 4 grid of output micro-tiles
_MMA_SMEM_PAD = 8                        # halves per row: 16-byte rows, conflict-free fragment loads
_SIMT_SMEM_PAD = 1                       # floats per B row: breaks the power-of-two stride of the stores
# Registers besides the tile: row origin, image and weight bases (64-bit), tap decode, loop counters;
# the mma path also keeps fragment addresses for the two 16-wide k steps of a tile.
_MMA_ADDRESSING, _SIMT_ADDRESSING = 28, 22
_MAX_INDEX = 2**31 - 1                   # in-image offsets and the GEMM row index are 32-bit ints
_MAX_GRID_YZ = 65535
# Fraction of the unit's peak: the im2col gather (scalar predicated loads, integer address math)
# competes with the math, so a direct conv reaches less than a dense GEMM of the same size.
_MMA_EFFICIENCY = {8: 0.5, 9: 0.4}       # by compute-capability major; sm_90 peak is wgmma's
_SIMT_EFFICIENCY = 0.6
# Depthwise: FFMA from registers fed by broadcast tap loads and 16-byte window loads; the staging
# sync and the integer work of edge tiles keep it from the FP32 peak.
_DEPTHWISE_EFFICIENCY = 0.7


@dataclass(frozen=True)
class ConvSchedule(Schedule):
    """A block computes a bm x bn tile of (output positions x output channels), bk taps at a time."""
    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


@dataclass(frozen=True)
class DepthwiseSchedule(Schedule):
    """A block computes a tile = (rows, columns) of one output channel's plane with `threads` threads,
    each `outputs_per_thread` consecutive outputs of one row (so rows * columns = threads * that)."""
    threads: int
    outputs_per_thread: int
    tile: tuple[int, int]


@dataclass(frozen=True)
class _Conv:
    """The convolution's sizes, normalized to two spatial axes (conv1d: height 1)."""
    n: int
    c: int
    h: int
    w: int
    o: int
    groups: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]                 # low padding (top, left); high padding only sets oh, ow
    dilation: tuple[int, int]
    dtype: DType

    @classmethod
    def of(cls, op: KernelOp) -> _Conv:
        x, w = op.operands
        a = op.attr_map
        flat = len(x.shape) == 3             # conv1d: prepend a height axis of size one

        def two(values, unit):
            return (unit,) + tuple(values) if flat else tuple(values)

        def shape(t: TensorType) -> tuple[int, ...]:
            return t.shape[:2] + (1,) + t.shape[2:] if flat else t.shape

        (n, c, h, wd), (o, _, kh, kw), (_, _, oh, ow) = shape(x), shape(w), shape(op.result)
        pads = two(a["padding"], (0, 0))
        return cls(n=n, c=c, h=h, w=wd, o=o, groups=a["groups"], kh=kh, kw=kw, oh=oh, ow=ow,
                   stride=two(a["stride"], 1), pad=(pads[0][0], pads[1][0]), dilation=two(a["dilation"], 1),
                   dtype=x.dtype)

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of one group's implicit GEMM."""
        return self.n * self.oh * self.ow, self.og, self.cg * self.kh * self.kw

    @property
    def tensor_cores(self) -> bool:
        return self.dtype in _TENSOR_CORE_DTYPES

    @property
    def depthwise(self) -> bool:
        """One input channel per group: the implicit GEMM would be one output channel wide."""
        return self.cg == 1


_STATIC_SMEM_LIMIT = 48 * 1024           # static __shared__ arrays; more needs dynamic smem and opt-in


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# The defaults, best first; the first three that fit the op and the architecture are offered.
_MMA_CANDIDATES = ((128, 64, 32, 4, 2), (64, 64, 32, 2, 2), (128, 128, 32, 4, 2),
                   (128, 32, 32, 4, 1), (64, 16, 32, 4, 1))
_SIMT_CANDIDATES = ((64, 64, 16, 2, 2), (128, 64, 16, 4, 2), (64, 32, 16, 2, 2), (64, 16, 16, 4, 1))


class DirectConvTemplate(Template):
    kind = "conv"
    ops = frozenset({"conv1d", "conv2d"})

    def accepts(self, op: KernelOp) -> bool:
        if op.op not in self.ops:
            return False
        x, w = op.operands
        if not (x.dtype == w.dtype == op.result.dtype and x.dtype in (*_TENSOR_CORE_DTYPES, DType.float32)):
            return False  # mixed-precision or float64 convolutions have no kernel here
        cv = _Conv.of(op)
        return (max(cv.gemm[0], x.numel // cv.n, op.result.numel // cv.n, w.numel) <= _MAX_INDEX
                and cv.groups <= _MAX_GRID_YZ)

    def fused(self, op: KernelOp) -> tuple[str, ...]:
        return ()

    def schedules(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        cv = _Conv.of(op)
        if cv.depthwise and (depthwise := self._depthwise_schedules(cv, arch)):
            return depthwise
        candidates = _MMA_CANDIDATES if cv.tensor_cores else _SIMT_CANDIDATES
        # a tile wider than the group's output channels (rounded up to a power of two) only pads
        widest = max(16, _pow2(cv.og))
        valid = [ConvSchedule(*c) for c in candidates if c[1] <= widest]
        valid = [s for s in valid if self._fits(cv, s, arch)]
        return tuple(valid[:3])

    def space(self, op: KernelOp, arch: ArchSpec) -> tuple[Schedule, ...]:
        cv = _Conv.of(op)
        defaults = self.schedules(op, arch)
        if isinstance(defaults[0], DepthwiseSchedule):
            grid = (DepthwiseSchedule(*p) for p in depthwise_grid(cv.oh, cv.ow))
        else:
            grid = (ConvSchedule(*p) for p in implicit_gemm_grid(cv.tensor_cores, max(16, _pow2(cv.og))))
        return grid_space(defaults, grid, lambda s: self.valid(op, s, arch))

    def valid(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> bool:
        if isinstance(schedule, DepthwiseSchedule):
            return self.accepts(op) and _Conv.of(op).depthwise and _depthwise_fits(_Conv.of(op), schedule, arch)
        return isinstance(schedule, ConvSchedule) and self.accepts(op) and self._fits(_Conv.of(op), schedule, arch)

    @staticmethod
    def _depthwise_schedules(cv: _Conv, arch: ArchSpec) -> tuple[DepthwiseSchedule, ...]:
        """Tiles as wide as the output row (to a power of two) up to a block's worth of outputs, and as
        many rows as that leaves; small planes get fewer threads rather than idle ones, down to a warp."""
        valid = []
        for threads, v in _DEPTHWISE_CANDIDATES:
            tw = min(threads * v, max(v, _pow2(cv.ow)))
            threads = max(32, tw * min(threads * v // tw, _pow2(cv.oh)) // v)
            s = DepthwiseSchedule(threads, v, (threads * v // tw, tw))
            if s not in valid and _depthwise_fits(cv, s, arch):
                valid.append(s)
        return tuple(valid[:3])

    def _fits(self, cv: _Conv, s: ConvSchedule, arch: ArchSpec) -> bool:
        lanes_m, lanes_n = (_MMA_M, _MMA_N) if cv.tensor_cores else (_SIMT_LANES_M, _SIMT_LANES_N)
        return (s.bm % (s.warps_m * lanes_m) == 0 and s.bn % (s.warps_n * lanes_n) == 0
                and (not cv.tensor_cores or s.bk % _MMA_K == 0)
                # each thread gathers one A row and one B k-column, whole elements per thread
                and s.threads % s.bm == 0 and s.threads % s.bk == 0
                and (s.bm * s.bk) % s.threads == 0 and (s.bn * s.bk) % s.threads == 0
                and s.threads <= arch.max_threads_per_block
                and _cdiv(cv.og, s.bn) <= _MAX_GRID_YZ
                and self._smem(cv, s) <= min(arch.smem_per_block, _STATIC_SMEM_LIMIT)
                and self._registers(cv, s) <= _register_limit(s.threads, arch))

    @staticmethod
    def _smem(cv: _Conv, s: ConvSchedule) -> int:
        if cv.tensor_cores:
            return (s.bm + s.bn) * (s.bk + _MMA_SMEM_PAD) * cv.dtype.itemsize
        return s.bk * (s.bm + s.bn + _SIMT_SMEM_PAD) * cv.dtype.itemsize

    @staticmethod
    def _registers(cv: _Conv, s: ConvSchedule) -> int:
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
            return _depthwise_resources(op, schedule, arch)
        assert isinstance(schedule, ConvSchedule)
        cv, s = _Conv.of(op), schedule
        m, n, k = cv.gemm
        tiles_m, tiles_n, tiles_k = _cdiv(m, s.bm), _cdiv(n, s.bn), _cdiv(k, s.bk)
        x_bytes, w_bytes = (t.nbytes for t in op.operands)
        # x is streamed once per output-channel tile (blockIdx.x walks the rows first); halo re-reads
        # of neighbouring rows and those per-tile passes hit L2 while x fits in half of it.
        x_traffic = x_bytes * (tiles_n if x_bytes > arch.l2_bytes // 2 else 1)
        w_traffic = w_bytes * (tiles_m if w_bytes > arch.l2_bytes // 2 else 1)
        registers = self._registers(cv, s)
        limit = _register_limit(s.threads, arch)
        if cv.tensor_cores:
            unit, efficiency = MathUnit.BF16, _MMA_EFFICIENCY.get(arch.compute_capability[0], _MMA_EFFICIENCY[9])
        else:
            unit, efficiency = MathUnit.FP32, _SIMT_EFFICIENCY
        return Resources(
            threads=s.threads, blocks=tiles_m * tiles_n * cv.groups, registers=registers,
            smem_bytes=self._smem(cv, s), hbm_bytes=x_traffic + w_traffic + op.result.nbytes,
            flops=2 * tiles_m * s.bm * tiles_n * s.bn * tiles_k * s.bk * cv.groups,
            unit=unit, efficiency=efficiency, spill_bytes=4 * max(0, registers - limit))

    def emit(self, op: KernelOp, schedule: Schedule, arch: ArchSpec) -> KernelSource:
        cv = _Conv.of(op)
        if isinstance(schedule, DepthwiseSchedule):
            return _depthwise_emit(op, cv, schedule)
        assert isinstance(schedule, ConvSchedule)
        s = schedule
        name = f"conv_{'mma' if cv.tensor_cores else 'simt'}_{s.bm}x{s.bn}x{s.bk}_{s.warps_m}x{s.warps_n}"
        m, n, k = cv.gemm
        header = (f"// {op}\n// schedule: {s.describe()}\n"
                  f"// implicit GEMM per group: M={m} N={n} K={k}, groups={cv.groups}\n"
                  f"// launch: {name}(x, w, y); grid=({_cdiv(m, s.bm)}, {_cdiv(n, s.bn)}, {cv.groups}), "
                  f"block=({s.threads})\n")
        tile = dict(BM=s.bm, BN=s.bn, BK=s.bk, WARPS_M=s.warps_m, WARPS_N=s.warps_n,
                    PAD=_MMA_SMEM_PAD if cv.tensor_cores else _SIMT_SMEM_PAD)
        suffix = _TENSOR_CORE_DTYPES[cv.dtype][1] if cv.tensor_cores else None
        return KernelSource(name, header + implicit_gemm_source(name, _gemm_sizes(cv), tile, suffix),
                            threads=s.threads, grid=(_cdiv(m, s.bm), _cdiv(n, s.bn), cv.groups),
                            fast_math=op.numerics is Numerics.FAST)

    def samples(self) -> tuple[KernelOp, ...]:
        bf16, f32 = DType.bfloat16, DType.float32
        return (
            conv_op((16, 64, 2048), (64, 64, 3), bf16, padding=((1, 1),)),
            conv_op((8, 64, 512), (128, 16, 5), f32, padding=((2, 2),), groups=4),
            conv_op((8, 64, 56, 56), (64, 64, 3, 3), bf16, padding=((1, 1), (1, 1))),
            conv_op((4, 32, 28, 28), (64, 32, 3, 3), f32, padding=((1, 1), (1, 1)), stride=(2, 2)),
            # depthwise: short and long (Hyena-style causal) 1-d kernels, a channel multiplier of 2
            # with stride and dilation (scalar window reads), MobileNet 3x3 and ConvNeXt 7x7
            conv_op((16, 768, 4096), (768, 1, 3), bf16, padding=((1, 1),), groups=768),
            conv_op((16, 768, 2048), (768, 1, 64), bf16, padding=((63, 0),), groups=768),
            conv_op((8, 256, 1000), (512, 1, 5), f32, padding=((4, 4),), stride=(2,), dilation=(2,), groups=256),
            conv_op((8, 128, 56, 56), (128, 1, 3, 3), bf16, padding=((1, 1), (1, 1)), groups=128),
            conv_op((8, 96, 28, 28), (96, 1, 7, 7), f32, padding=((3, 3), (3, 3)), groups=96),
        )


def _pow2(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


def _gemm_sizes(cv: _Conv) -> dict[str, int]:
    return {"CV_C": cv.c, "CV_H": cv.h, "CV_W": cv.w, "CV_O": cv.o, "CV_CG": cv.cg, "CV_OG": cv.og,
            "CV_KH": cv.kh, "CV_KW": cv.kw, "CV_OH": cv.oh, "CV_OW": cv.ow, "CV_SH": cv.stride[0],
            "CV_SW": cv.stride[1], "CV_PH": cv.pad[0], "CV_PW": cv.pad[1], "CV_DH": cv.dilation[0],
            "CV_DW": cv.dilation[1], "CV_M": cv.gemm[0]}


# ---- depthwise ----------------------------------------------------------------------------

# (threads, outputs per thread), best first: 8 per thread reuse each staged input 8 times from
# registers and store 16 bytes of bf16 at once; 4 per thread suit narrow planes.
_DEPTHWISE_CANDIDATES = ((128, 8), (256, 4), (64, 8), (128, 4))
# Registers besides the accumulators: x, w and y bases (64-bit), tile origin and thread decode,
# the staging loop's index, the edge tests of the store, and the few window values in flight
# (ptxas consumes each loaded input in its FMAs before the next loads; it keeps no full window).
_DEPTHWISE_ADDRESSING = 24


def _layout(cv: _Conv, s: DepthwiseSchedule) -> DepthwiseLayout:
    return DepthwiseLayout.of((cv.kh, cv.kw), cv.stride, cv.dilation, s.tile, s.outputs_per_thread)


def _depthwise_registers(cv: _Conv, s: DepthwiseSchedule) -> int:
    """Accumulators + addressing; when the tap rows are unrolled (taps in registers, more than one
    row) ptxas loads the next row's whole window while the current row's FMAs run."""
    win = _layout(cv, s)
    v = s.outputs_per_thread
    window = (v - 1) * cv.stride[1] + (win.tj - 1) * cv.dilation[1] + 1
    prefetch = window if win.taps_in_registers and cv.kh > 1 else 0
    return v + prefetch + _DEPTHWISE_ADDRESSING


def _depthwise_smem(cv: _Conv, s: DepthwiseSchedule) -> int:
    win = _layout(cv, s)
    taps = 0 if win.taps_in_registers else cv.kh * win.kwp
    return 4 * (win.rows_in * win.srow + taps)              # fp32 staging


def _depthwise_fits(cv: _Conv, s: DepthwiseSchedule, arch: ArchSpec) -> bool:
    th, tw = s.tile
    # the store packs a thread's outputs into whole 32-bit words
    return (th * tw == s.threads * s.outputs_per_thread and tw % s.outputs_per_thread == 0
            and s.outputs_per_thread * cv.dtype.itemsize % 4 == 0
            and s.threads % 32 == 0 and s.threads <= arch.max_threads_per_block
            and cv.o <= _MAX_GRID_YZ and cv.n <= _MAX_GRID_YZ
            and _depthwise_smem(cv, s) <= min(arch.smem_per_block, _STATIC_SMEM_LIMIT)
            and _depthwise_registers(cv, s) <= _register_limit(s.threads, arch))


def _depthwise_grid(cv: _Conv, s: DepthwiseSchedule) -> tuple[int, int, int]:
    """(output tiles of a plane, output channels, images)."""
    th, tw = s.tile
    return _cdiv(cv.oh, th) * _cdiv(cv.ow, tw), cv.o, cv.n


def _depthwise_resources(op: KernelOp, s: DepthwiseSchedule, arch: ArchSpec) -> Resources:
    cv = _Conv.of(op)
    win = _layout(cv, s)
    tiles, channels, images = _depthwise_grid(cv, s)
    blocks = tiles * channels * images
    registers = _depthwise_registers(cv, s)
    # Every block's outputs are computed, edge ones included, over the zero-padded kernel rows.
    flops = 2 * blocks * s.threads * s.outputs_per_thread * cv.kh * win.kwp
    # x, w and y cross HBM once: a tile's halo overlaps its neighbours' by (kernel - 1) * dilation
    # columns (and rows), re-read by blocks of the same plane that run together, hits in L2; a
    # channel multiplier's extra readers of one input plane are adjacent in blockIdx.y, hits too.
    hbm = op.operand_bytes + op.result.nbytes
    return Resources(threads=s.threads, blocks=blocks, registers=registers, smem_bytes=_depthwise_smem(cv, s),
                     hbm_bytes=hbm, flops=flops, unit=MathUnit.FP32, efficiency=_DEPTHWISE_EFFICIENCY,
                     spill_bytes=4 * max(0, registers - _register_limit(s.threads, arch)))


def _depthwise_emit(op: KernelOp, cv: _Conv, s: DepthwiseSchedule) -> KernelSource:
    win = _layout(cv, s)
    th, tw = s.tile
    name = f"conv_depthwise_{s.threads}x{s.outputs_per_thread}_{th}x{tw}"
    sizes = dict(C=cv.c, H=cv.h, W=cv.w, O=cv.o, MULT=cv.og, KH=cv.kh, KW=cv.kw, OH=cv.oh, OW=cv.ow,
                 SH=cv.stride[0], SW=cv.stride[1], PH=cv.pad[0], PW=cv.pad[1], DH=cv.dilation[0],
                 DW=cv.dilation[1], TH=th, TW=tw, V=s.outputs_per_thread, THREADS=s.threads)
    suffix = _TENSOR_CORE_DTYPES[cv.dtype][1] if cv.dtype in _TENSOR_CORE_DTYPES else None
    header = (f"// {op}\n// schedule: {s.describe()}\n"
              f"// depthwise sliding window: {cv.og} output channel(s) per input channel, "
              f"taps in {'registers' if win.taps_in_registers else 'shared memory'}\n"
              f"// launch: {name}(x, w, y); grid={_depthwise_grid(cv, s)}, block=({s.threads})\n")
    return KernelSource(name, header + depthwise_source(name, sizes, suffix, win), threads=s.threads,
                        grid=_depthwise_grid(cv, s), fast_math=op.numerics is Numerics.FAST)


def _register_limit(threads: int, arch: ArchSpec) -> int:
    """What ptxas may use under __launch_bounds__(threads): the file split over one block."""
    return min(arch.registers_per_thread, arch.registers_per_sm // threads)


def conv_op(x: tuple[int, ...], w: tuple[int, ...], dtype: DType, *, padding, stride=None, dilation=None,
            groups: int = 1) -> KernelOp:
    """A conv1d/conv2d KernelOp from shapes and normalized attributes (the result shape is inferred).

    >>> conv_op((1, 4, 10), (8, 4, 3), DType.float32, padding=((1, 1),)).result.shape
    (1, 8, 10)
    """
    spatial = len(x) - 2
    attrs = dict(stride=stride or (1,) * spatial, padding=padding, dilation=dilation or (1,) * spatial,
                 groups=groups)
    name = f"conv{spatial}d"
    operands = (TensorType(x, dtype), TensorType(w, dtype))
    return KernelOp.of(name, operands, OPS[name].infer(*operands, **attrs), **attrs)


