"""Schedule pins applied to a plan: each pin's tile goes to the GEMM kernels computing its product.

A pinned kernel is not tuned: among the template's schedules with the pinned tile, the cost model
picks the warps and stages (and the K depth when the pin gives only (bm, bn)). A tile the kernel
cannot run is an error listing the tiles it can; a pin no kernel of the chosen plan takes is a
PinWarning, since the product still computes correctly, just not with the tile asked for.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.algebra.schedule_pin import SchedulePin
>>> from tessera_rw.codegen.arch import arch_named
>>> a, b = TensorType((512, 256), DType.bfloat16), TensorType((256, 1024), DType.bfloat16)
>>> op = KernelOp.of("matmul", (a, b), TensorType((512, 1024), DType.bfloat16), accum_dtype=None)
>>> [p] = pin_steps([(0, op)], arch_named("A100-SXM"), (SchedulePin.of((a, b), (64, 128, 32), None),))
>>> p.step, p.tuning.schedule.bm, p.tuning.schedule.bn, p.tuning.schedule.bk, str(p.tuning.chosen_by)
(0, 64, 128, 32, 'pinned')
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from tessera_rw.algebra.builder import describe_operands, warn_at_user_line
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.schedule_pin import SchedulePin
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.gemm_problem import GemmProblem
from tessera_rw.codegen.templates.registry import template_for, templates_for
from tessera_rw.tune.cost import best_schedule
from tessera_rw.tune.kernel_tuner import KernelTuning
from tessera_rw.tune.records import ChosenBy
from tessera_rw.tune.space import SpaceRestriction, knobs, ranked_space

_LISTED_TILES = 12


class PinWarning(UserWarning):
    """A schedule pin that no kernel of the chosen plan takes."""


@dataclass(frozen=True)
class PinnedStep:
    """Step `step` of a plan runs the schedule `tuning` holds because of `pin`."""
    step: int
    pin: SchedulePin
    tuning: KernelTuning


def product_dims(op: KernelOp) -> tuple[tuple[int, ...], int, int, int] | None:
    """(batch, M, N, K) of the product a GEMM-kind kernel computes, None for other kernels."""
    found = templates_for(op)
    if not found or found[0].kind != "gemm":
        return None
    p = GemmProblem.of(op)
    return p.batch, p.a_rows, p.n, p.k


def pin_steps(ops: Sequence[tuple[int, KernelOp]], arch: ArchSpec, pins: Sequence[SchedulePin]) -> tuple[PinnedStep, ...]:
    """The steps among `ops` ((step index, KernelOp) of a plan's tunable kernels) that pins fix."""
    if not pins:
        return ()
    _refuse_conflicts(pins)
    found = []
    for i, op in ops:
        dims = product_dims(op)
        pin = next((p for p in pins if p.dims == dims), None)    # pins of one dims agree (conflicts are refused)
        if pin is not None:
            found.append(PinnedStep(i, pin, pinned_tuning(op, arch, pin)))
    return tuple(found)


def pinned_tuning(op: KernelOp, arch: ArchSpec, pin: SchedulePin) -> KernelTuning:
    """The cost model's best schedule of `op` with the pinned tile, as a KernelTuning 'pinned'."""
    template = template_for(op)
    kind = template.kind_of(op)
    tile = _nearest_depth(pin, sorted({knobs(s)["tile"] for s in template.space(op, arch)}), op, arch)
    try:
        space = ranked_space(template, op, arch, SpaceRestriction(tile_sizes=(tile,)))
    except ArgumentError:
        tiles = sorted({knobs(s)["tile"] for s in template.space(op, arch)})
        listed = ", ".join(str(t) for t in tiles[:_LISTED_TILES])
        more = f" and {len(tiles) - _LISTED_TILES} more" if len(tiles) > _LISTED_TILES else ""
        raise ArgumentError(f"{pin.describe()}: the {kind} kernel computing it on {arch.name} has no schedule "
                            f"with that tile that fits", op="matmul",
                            operands=describe_operands(("a", "b"), op.operands[:2]), site=pin.site,
                            hint=f"its tiles (bm, bn, bk): {listed}{more}; or leave tile_shape out and let the "
                                 "cost model or autotune choose") from None
    return KernelTuning(op, kind, space.schedules[0], best_schedule(template, op, arch)[0], ChosenBy.PINNED,
                        space.estimates[0], 0.0, None, len(space), len(space.pruned))


def _nearest_depth(pin: SchedulePin, tiles: Sequence[tuple[int, ...]], op: KernelOp, arch: ArchSpec) -> tuple[int, ...]:
    """The pinned tile, or where the kernel has its (bm, bn) only with other k depths (float32's
    are shallower than bf16's), the nearest of those, with a PinWarning saying so."""
    if len(pin.tile) != 3 or pin.tile in tiles:
        return pin.tile
    depths = sorted({t[2] for t in tiles if t[:2] == pin.tile[:2]})
    if not depths:
        return pin.tile
    bk = min(depths, key=lambda d: (abs(math.log2(d / pin.tile[2])), -d))
    warn_at_user_line(PinWarning(
        f"op.matmul {pin.describe()}{pin.where()}: the gemm kernel for {op.operands[0].dtype.name} on {arch.name} "
        f"takes bk in {depths} with a {pin.tile[0]}x{pin.tile[1]} tile; pinned {(*pin.tile[:2], bk)}"))
    return (*pin.tile[:2], bk)


def _refuse_conflicts(pins: Sequence[SchedulePin]) -> None:
    by_dims: dict[tuple, SchedulePin] = {}
    for pin in pins:
        other = by_dims.setdefault(pin.dims, pin)
        if other.tile != pin.tile:
            raise ArgumentError(f"two matmuls of the same shape pin different tiles: {other.describe()}{other.where()} "
                                f"and {pin.describe()}{pin.where()}", op="matmul",
                                hint="a pin names a product by its dims, so equal products share one tile: pin them "
                                     "alike, or narrow the whole kernel with kernel.schedule.search_space(...)")


def warn_unused(pins: Sequence[SchedulePin], pinned: Sequence[PinnedStep], kernels: Sequence[str]) -> None:
    """A PinWarning for each pin no step took; `kernels` names the chosen plan's kernels."""
    taken = {(p.pin.dims, p.pin.tile) for p in pinned}    # a step takes the first of equal pins for all of them
    for pin in pins:
        if (pin.dims, pin.tile) not in taken:
            listing = ", ".join(kernels) if kernels else "none"
            warnings.warn(PinWarning(
                f"op.matmul {pin.describe()}{pin.where()} is not used: no generated GEMM kernel of the chosen plan "
                f"computes that product (its kernels: {listing}); a fused kernel (attention, an FFT convolution) "
                "or a dtype without a GPU template (float64) computes it instead"), stacklevel=2)
