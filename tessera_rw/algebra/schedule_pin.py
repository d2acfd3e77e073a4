"""Schedule pins: `op.matmul(a, b, tile_shape=(128, 128, 64))` fixes the tile of the GEMM kernel
that computes that product, and that kernel is not tuned.

A pin names a product by its dims (batch, M, N, K), not by a graph node: rewriting replaces the
matmul node (a gemm with a fused epilogue, a transposed operand read in place), but the kernel
computing it still multiplies an M×K by a K×N matrix. Tracing collects the pins a function's
matmuls make (`collecting_pins`); the pipeline gives each to the GEMM kernels of the chosen plan
with those dims (tune/pins.py), and says so when none computes the product (it was fused into an
attention kernel, say).

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> pin = SchedulePin.of((TensorType((4, 256, 64), DType.bfloat16), TensorType((64, 512), DType.bfloat16)),
...                      (128, 128, 32), site=None)
>>> (pin.batch, pin.m, pin.n, pin.k), pin.describe()
(((4,), 256, 512, 64), 'tile_shape=(128, 128, 32) on the 4×256×512×64 matmul')
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
from dataclasses import dataclass
from typing import Iterator, Sequence

from tessera_rw.algebra.errors import AttributeValueError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import matmul_dims

_PINS: contextvars.ContextVar[list[SchedulePin] | None] = contextvars.ContextVar("tessera_pins", default=None)


def parse_tile_shape(tile_shape: object) -> tuple[int, ...]:
    """(bm, bn) or (bm, bn, bk), positive ints; anything else is an AttributeValueError."""
    items = tuple(tile_shape) if isinstance(tile_shape, (tuple, list)) else None
    if (items is None or len(items) not in (2, 3)
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in items)):
        raise AttributeValueError(f"tile_shape must be (bm, bn) or (bm, bn, bk) positive ints, got {tile_shape!r}",
                                  hint="e.g. tile_shape=(128, 128, 64); (bm, bn) leaves the K depth to the cost model")
    return tuple(int(v) for v in items)


@dataclass(frozen=True)
class SchedulePin:
    """The tile a user fixed for the product batch × (M×K @ K×N), and where they asked for it."""
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    tile: tuple[int, ...]
    site: str | None

    @staticmethod
    def of(operands: Sequence[TensorType], tile: tuple[int, ...], site: str | None) -> SchedulePin:
        batch, m, n, k = matmul_dims(operands[0].shape, operands[1].shape)
        return SchedulePin(batch, m, n, k, tile, site)

    @property
    def dims(self) -> tuple[tuple[int, ...], int, int, int]:
        return self.batch, self.m, self.n, self.k

    def describe(self) -> str:
        product = "×".join(str(d) for d in (*self.batch, self.m, self.n, self.k))
        return f"tile_shape={self.tile} on the {product} matmul"

    def where(self) -> str:
        """' (at file:line in f: source)' when the pin's call site is known, else ''."""
        return f" (at {self.site})" if self.site else ""


@contextlib.contextmanager
def collecting_pins() -> Iterator[list[SchedulePin]]:
    """Collect the pins made while active (one trace) into the yielded list."""
    pins: list[SchedulePin] = []
    token = _PINS.set(pins)
    try:
        yield pins
    finally:
        _PINS.reset(token)


def record_pin(pin: SchedulePin) -> None:
    """Keep `pin` for the trace in progress (outside a trace there is nothing to keep it for)."""
    pins = _PINS.get()
    if pins is not None and pin not in pins:
        pins.append(pin)
