"""Target architectures: what the cost model divides by and what a schedule must fit in.

Figures are the vendors' published dense (non-sparse) peaks at boost clock. The current target is
`TESSERA_ARCH` when set (a name or alias from `KNOWN_ARCHS`), else the GPU in this process
(name and compute capability through cuda.core):

>>> arch_named("h100").sm
'sm_90'
>>> arch_named("sm_80").name
'A100-SXM'
>>> arch_named("H100-SXM").peak_flops("bfloat16") / 1e12
989.4
"""

from __future__ import annotations

import enum
import os
import re
from functools import cache
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError

ARCH_ENV = "TESSERA_ARCH"
WARP_SIZE = 32   # threads per warp, on every NVIDIA arch
REGISTER_UNIT = 256   # registers are allocated to a warp in units of this many


class ArchError(TesseraError):
    """No known architecture for the device or the name asked for."""


class MathUnit(enum.Enum):
    """Which pipe a kernel's arithmetic runs on; each has its own peak."""
    FP64 = "fp64"
    FP32 = "fp32"          # CUDA cores (SIMT)
    TF32 = "tf32"          # tensor cores, fp32 in, fp32 accumulate
    BF16 = "bf16"          # tensor cores, bf16/fp16 in, fp32 accumulate
    FP8 = "fp8"            # tensor cores, e4m3/e5m2 in, fp32 accumulate


def tensor_unit(dtype: DType, allow_tf32: bool = False) -> MathUnit:
    """The unit a matrix product of `dtype` operands runs on (fp32 uses tf32 only when allowed)."""
    if dtype in (DType.bfloat16, DType.float16):
        return MathUnit.BF16
    if dtype in (DType.float8_e4m3, DType.float8_e5m2):
        return MathUnit.FP8
    if dtype is DType.float64 or dtype is DType.complex128:
        return MathUnit.FP64
    return MathUnit.TF32 if allow_tf32 else MathUnit.FP32


class ArchSpec(BaseModel):
    """One GPU model. Frozen: a spec is a fact about hardware, never tuned in place."""
    model_config = ConfigDict(frozen=True)

    name: str
    aliases: tuple[str, ...] = ()
    device_names: tuple[str, ...] = Field(description="substrings of cuda.core's device name that identify it")
    compute_capability: tuple[int, int]
    sm_count: int
    clock_mhz: int
    peak_tflops: Mapping[MathUnit, float] = Field(description="dense peak per math unit; absent = unsupported")
    hbm_gbps: float
    l2_bytes: int
    smem_per_sm: int
    smem_per_block: int          # the opt-in maximum for one block
    registers_per_sm: int = 65536
    registers_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    max_threads_per_block: int = 1024
    launch_us: float = 2.5       # back-to-back launch overhead on one stream
    # what the L2 feeds the SMs, bytes per clock per SM (sm_90: fitted to H200 timings of GEMM tiles)
    l2_feed_bytes_per_clock: float = 43.0

    @property
    def l2_feed_bytes_per_s(self) -> float:
        """Bytes per second the L2 delivers into all SMs together."""
        return self.l2_feed_bytes_per_clock * self.sm_count * self.clock_mhz * 1e6

    def __hash__(self) -> int:  # a spec is identified by its name and compute capability
        return hash((self.name, self.compute_capability))

    @property
    def sm(self) -> str:
        """'sm_90' for compute capability 9.0: NVRTC's --gpu-architecture."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    def register_limit(self, threads: int) -> int:
        """The registers a thread of a `threads`-thread block may hold: ptxas's ceiling, or the
        register file split over one block (__launch_bounds__(threads) keeps it at one block)."""
        return min(self.registers_per_thread, self.registers_per_sm // threads)

    def resident_blocks(self, threads: int, registers: int, smem_bytes: int) -> int:
        """Blocks of `threads` threads, each holding `registers` registers and `smem_bytes` of shared
        memory, that one SM runs at once: the least of the block cap, the warps, the register file
        (allocated per warp in units of 256) and shared memory; 0 when not one fits."""
        if threads > self.max_threads_per_block or smem_bytes > self.smem_per_block:
            return 0
        warps = -(-threads // WARP_SIZE)
        per_warp = -(-min(registers, self.registers_per_thread) * WARP_SIZE // REGISTER_UNIT) * REGISTER_UNIT
        limits = [self.max_blocks_per_sm, self.max_warps_per_sm // warps,
                  self.registers_per_sm // max(per_warp * warps, 1)]
        if smem_bytes:
            limits.append(self.smem_per_sm // smem_bytes)
        return max(0, min(limits))

    def has(self, unit: MathUnit) -> bool:
        return unit in self.peak_tflops

    def peak_flops(self, unit: MathUnit | DType | str) -> float:
        """FLOP/s of a math unit; a dtype means the tensor-core unit of its matrix products."""
        if not isinstance(unit, MathUnit):
            unit = tensor_unit(DType.parse(unit) if isinstance(unit, str) else unit)
        if unit not in self.peak_tflops:
            raise ArchError(f"{self.name} has no {unit.value} math unit",
                            hint=f"it has {', '.join(u.value for u in self.peak_tflops)}")
        return self.peak_tflops[unit] * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which bf16 tensor-core work stops being bandwidth-bound."""
        return self.peak_flops(MathUnit.BF16) / self.hbm_bytes_per_s


_KB, _MB = 1024, 1024 * 1024
U = MathUnit

_H100_SXM = ArchSpec(name="H100-SXM", aliases=("h100", "h100-sxm5"), device_names=("H100 80GB HBM3", "H100 SXM"),
                   compute_capability=(9, 0), sm_count=132, clock_mhz=1980, hbm_gbps=3350, l2_bytes=50 * _MB,
                   peak_tflops={U.FP64: 33.5, U.FP32: 66.9, U.TF32: 494.7, U.BF16: 989.4, U.FP8: 1978.9},
                   smem_per_sm=228 * _KB, smem_per_block=227 * _KB)

KNOWN_ARCHS: tuple[ArchSpec, ...] = (
    ArchSpec(name="A100-SXM", aliases=("a100",), device_names=("A100",), compute_capability=(8, 0),
             sm_count=108, clock_mhz=1410, hbm_gbps=2039, l2_bytes=40 * _MB,
             peak_tflops={U.FP64: 9.7, U.FP32: 19.5, U.TF32: 156, U.BF16: 312},
             smem_per_sm=164 * _KB, smem_per_block=163 * _KB, l2_feed_bytes_per_clock=33.0),
    ArchSpec(name="L4", aliases=("l4",), device_names=("L4",), compute_capability=(8, 9),
             sm_count=58, clock_mhz=2040, hbm_gbps=300, l2_bytes=48 * _MB,
             peak_tflops={U.FP64: 0.49, U.FP32: 30.3, U.TF32: 60, U.BF16: 121, U.FP8: 242.5},
             smem_per_sm=100 * _KB, smem_per_block=99 * _KB, max_warps_per_sm=48, max_blocks_per_sm=24),
    ArchSpec(name="RTX-4090", aliases=("4090", "rtx4090"), device_names=("RTX 4090",), compute_capability=(8, 9),
             sm_count=128, clock_mhz=2520, hbm_gbps=1008, l2_bytes=72 * _MB,
             peak_tflops={U.FP64: 1.29, U.FP32: 82.6, U.TF32: 82.6, U.BF16: 165.2, U.FP8: 330.3},
             smem_per_sm=100 * _KB, smem_per_block=99 * _KB, max_warps_per_sm=48, max_blocks_per_sm=24),
    _H100_SXM,
    ArchSpec(name="H100-PCIe", aliases=("h100-pcie",), device_names=("H100 PCIe",), compute_capability=(9, 0),
             sm_count=114, clock_mhz=1755, hbm_gbps=2000, l2_bytes=50 * _MB,
             peak_tflops={U.FP64: 25.6, U.FP32: 51.2, U.TF32: 378, U.BF16: 756, U.FP8: 1513},
             smem_per_sm=228 * _KB, smem_per_block=227 * _KB),
    _H100_SXM.model_copy(update={"name": "H200", "aliases": ("h200",), "device_names": ("H200",),
                                 "hbm_gbps": 4800}),   # the H100 SXM die with HBM3e
    ArchSpec(name="B200", aliases=("b200",), device_names=("B200",), compute_capability=(10, 0),
             sm_count=148, clock_mhz=1965, hbm_gbps=8000, l2_bytes=126 * _MB,
             peak_tflops={U.FP64: 37, U.FP32: 75, U.TF32: 1100, U.BF16: 2250, U.FP8: 4500},
             smem_per_sm=228 * _KB, smem_per_block=227 * _KB),
)

_HOW_TO_ADD = ("name one of them (or a compute capability such as sm_90) with --arch, TESSERA_ARCH or "
               "autotune(..., arch=), or describe the GPU with tessera_rw.codegen.arch.ArchSpec(...) and pass that")


def _key(text: str) -> str:
    return text.lower().replace("_", "-").replace(" ", "-")


def known_names() -> list[str]:
    return [a.name for a in KNOWN_ARCHS]


def arch_named(name: str) -> ArchSpec:
    """The known architecture called `name` or one of its aliases (case-insensitive); a compute
    capability such as 'sm_90' names the first known GPU of it (sm_90: H100-SXM), and so does its
    arch-specific target ('sm_90a', which the warpgroup kernels compile for).

    >>> arch_named("sm_90a").name, arch_named("SM_80").name
    ('H100-SXM', 'A100-SXM')
    """
    wanted = _key(name)
    for arch in KNOWN_ARCHS:
        if wanted in {_key(arch.name), *map(_key, arch.aliases)}:
            return arch
    capability = re.fullmatch(r"(sm-\d+)[af]?", wanted)
    for arch in KNOWN_ARCHS:
        if capability and capability[1] == _key(arch.sm):
            return arch
    raise ArchError(f"unknown architecture {name!r}; known: {', '.join(known_names())}", hint=_HOW_TO_ADD)


def arch_for_device(device_name: str, compute_capability: tuple[int, int]) -> ArchSpec:
    """The known architecture of a device as cuda.core names it, e.g. ('NVIDIA H100 80GB HBM3', (9, 0))."""
    for arch in KNOWN_ARCHS:
        if arch.compute_capability == tuple(compute_capability) and any(
                d.lower() in device_name.lower() for d in arch.device_names):
            return arch
    major, minor = compute_capability
    raise ArchError(f"no architecture spec for {device_name!r} (sm_{major}{minor}); known: "
                    f"{', '.join(known_names())}", hint=_HOW_TO_ADD)


@cache
def _device_identity() -> tuple[str, tuple[int, int]]:
    """GPU 0's name and compute capability as cuda.core reports them."""
    try:
        from cuda.core import Device
        device = Device(0)
        return device.name, tuple(device.compute_capability)
    except Exception as e:  # no driver, no GPU: say what to do instead
        raise ArchError(f"no GPU found ({type(e).__name__}: {e}) and {ARCH_ENV} is not set",
                        hint=f"set {ARCH_ENV} to one of {', '.join(known_names())} to plan for that GPU") from None


def _detected() -> ArchSpec:
    return arch_for_device(*_device_identity())


def is_this_gpu(arch: ArchSpec) -> bool:
    """Whether GPU 0 is a device of `arch` (its compute capability and one of its device names), so
    that kernels timed here stand for `arch`; False without a GPU.

    >>> is_this_gpu(arch_named("H100-SXM")) in (True, False)
    True
    """
    try:
        name, cc = _device_identity()
    except ArchError:
        return False
    return cc == tuple(arch.compute_capability) and any(d.lower() in name.lower() for d in arch.device_names)


def this_gpu_name() -> str:
    """GPU 0's name, or 'no GPU'."""
    try:
        return _device_identity()[0]
    except ArchError:
        return "no GPU"


def current_arch(environ: Mapping[str, str] = os.environ) -> ArchSpec:
    """`TESSERA_ARCH` if set, else the architecture of GPU 0."""
    name = environ.get(ARCH_ENV)
    return arch_named(name) if name else _detected()


def resolve_arch(arch: ArchSpec | str | None) -> ArchSpec:
    """An ArchSpec as given, a known name or compute capability ('A100-SXM', 'sm_80'), or None for
    target_arch().

    >>> resolve_arch("sm_80").name
    'A100-SXM'
    """
    if arch is None:
        return target_arch()
    return arch_named(arch) if isinstance(arch, str) else arch


def target_arch(default: str = "H100-SXM") -> ArchSpec:
    """The architecture to plan for: the current one, or `default` when there is no GPU and no
    TESSERA_ARCH (planning and explaining work on a CPU-only machine)."""
    try:
        return current_arch()
    except ArchError:
        if os.environ.get(ARCH_ENV):
            raise
        return arch_named(default)
