"""TMA tensor maps: how a kernel that loads tiles with the Tensor Memory Accelerator (sm_90) sees
one of its operands.

A kernel takes its tensor maps as `__grid_constant__` parameters after its pointers
(KernelSource.tensor_maps, in that order). Each is built at launch from the pointer of the kernel
argument it maps: on a GPU by the driver (cuda.core's `as_tensor_map`), in the emulator from the
same description passed on its command line. Extents and boxes are innermost first, as the
hardware and the PTX coordinates order them; strides are in bytes for the dims after the first.

>>> m = TensorMapSpec(operand=0, element_bytes=2, dims=(4096, 4096), strides=(8192,), box=(64, 128))
>>> m.emulator_argument()
'tma=0,2,128,2,4096,4096,8192,64,128'
>>> m.box_bytes
16384
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from tessera_rw.algebra.errors import TesseraError

SWIZZLE_BYTES = 128       # the 128-byte swizzle: each box row one swizzled 128-byte shared row
MAX_BOX = 256             # elements per box dimension
MAX_RANK = 5
STRIDE_ALIGN = 16         # bytes: global strides and the tensor's start


@dataclass(frozen=True)
class TensorMapSpec:
    """A tiled view of kernel argument `operand`: a tensor of `dims` elements of `element_bytes`
    bytes, `strides` bytes apart along dims[1:], read `box` elements at a time into shared memory
    with the 128-byte swizzle."""
    operand: int
    element_bytes: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]

    def __post_init__(self) -> None:
        rank = len(self.dims)
        problems = []
        if not 1 <= rank <= MAX_RANK or len(self.strides) != rank - 1 or len(self.box) != rank:
            problems.append(f"rank {rank} with {len(self.strides)} strides and a {len(self.box)}-d box")
        if any(d < 1 for d in self.dims) or any(not 1 <= b <= MAX_BOX for b in self.box):
            problems.append(f"extents {self.dims} and box {self.box} must be positive, the box at most {MAX_BOX}")
        if any(s % STRIDE_ALIGN for s in self.strides):
            problems.append(f"strides {self.strides} must be multiples of {STRIDE_ALIGN} bytes")
        if self.box and self.box[0] * self.element_bytes != SWIZZLE_BYTES:
            problems.append(f"a box row of {self.box[0]} x {self.element_bytes} bytes must span the "
                            f"{SWIZZLE_BYTES}-byte swizzle")
        if problems:
            raise TesseraError(f"invalid TMA tensor map of argument {self.operand}: " + "; ".join(problems),
                               hint="this is a code generator bug; please report it with the kernel's source")

    @property
    def box_bytes(self) -> int:
        """Bytes one copy writes to shared memory (and completes as transactions on its mbarrier)."""
        return math.prod(self.box) * self.element_bytes

    def emulator_argument(self) -> str:
        """The map as the emulator's command line takes it (emu::tensor_map in emulator_ptx.h)."""
        fields = (self.operand, self.element_bytes, SWIZZLE_BYTES, len(self.dims), *self.dims, *self.strides,
                  *self.box)
        return "tma=" + ",".join(map(str, fields))

    def descriptor(self, pointer: int):
        """The driver's tensor map of the tensor at device address `pointer` (a cuda.core
        TensorMapDescriptor, which kernel launches take by value); built once per (map, pointer)
        on the current device."""
        return _descriptor(self, pointer)


class _MappedTensor:
    """The mapped tensor as a CUDA array interface (outermost first), for cuda.core to view."""

    def __init__(self, spec: TensorMapSpec, pointer: int):
        strides = (spec.element_bytes, *spec.strides)
        self.__cuda_array_interface__ = {
            "shape": tuple(reversed(spec.dims)), "strides": tuple(reversed(strides)),
            "typestr": f"<u{spec.element_bytes}" if spec.element_bytes > 1 else "|u1",
            "data": (pointer, False), "version": 3}


@lru_cache(maxsize=1024)
def _descriptor(spec: TensorMapSpec, pointer: int):
    from cuda.core._tensor_map import TensorMapL2Promotion, TensorMapSwizzle
    from cuda.core.utils import StridedMemoryView

    from tessera_rw.codegen.device import DeviceError
    if pointer % STRIDE_ALIGN:
        raise DeviceError(f"argument {spec.operand} starts at {pointer:#x}, which a TMA tensor map cannot: it must "
                          f"be {STRIDE_ALIGN}-byte aligned", hint="pass a tensor that owns its storage (.contiguous() "
                                                                  "copies a view that starts mid-allocation)")
    view = StridedMemoryView.from_cuda_array_interface(_MappedTensor(spec, pointer), stream_ptr=-1)
    try:
        # boxes are read whole: L2 fetches them in 256-byte sectors (what CUTLASS asks for too)
        return view.as_tensor_map(box_dim=tuple(reversed(spec.box)), swizzle=TensorMapSwizzle.SWIZZLE_128B,
                                  l2_promotion=TensorMapL2Promotion.L2_256B)
    except Exception as e:
        raise DeviceError(f"the driver refused the TMA tensor map of argument {spec.operand} "
                          f"({type(e).__name__}: {e}); map {spec}",
                          hint="this is a code generator bug; please report it with the kernel's source") from e
