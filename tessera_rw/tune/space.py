"""A kernel's search space: its template's valid schedules, narrowed by what the user asked for,
ranked by the cost model.

Users speak in the product's knobs, not in each template's field names: `tile_sizes` (bm, bn[, bk]),
`pipeline_stages`, `vectorize` and `warps`. A knob a template does not have (an elementwise
kernel has no tile) does not narrow that template's space. A schedule is stored in records as its
config, a flat dict of its fields, and found again by that config.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> from tessera_rw.codegen.arch import arch_named
>>> from tessera_rw.codegen.templates.registry import templates_for
>>> t = TensorType((1024, 1024), DType.bfloat16)
>>> op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
>>> space = ranked_space(templates_for(op)[0], op, arch_named("H100-SXM"), SpaceRestriction(tile_sizes=((128, 128),)))
>>> {(s.bm, s.bn) for s in space.schedules}
{(128, 128)}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Schedule, Template
from tessera_rw.tune.cost import schedule_cost


def schedule_config(schedule: Schedule) -> dict[str, object]:
    """The schedule as a record's config: {'bm': 128, 'bn': 128, ...} (tuples become lists), with
    its 'kind' when it has a tag (kinds of one template with the same fields). A quiet field at
    its default is left out, as `describe` leaves it out: records and timing logs written before
    the field existed name the same schedule."""
    quiet = schedule.quiet_fields()
    return {k: v for k, v in full_config(schedule).items() if k not in quiet or v != quiet[k]}


def full_config(schedule: Schedule) -> dict[str, object]:
    """The schedule's config with every field, quiet ones at their defaults too (how records and
    timing logs spelled it before quiet fields were left out)."""
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(schedule).items()}
    return config | {"kind": schedule.tag} if schedule.tag else config


def find_schedule(space: Iterable[Schedule], config: dict[str, object], *, loose: bool = False) -> Schedule | None:
    """The schedule of `space` whose config is `config` (spelled either way), None when the space no
    longer has it. `loose`: else the schedule that config names with its quiet fields (a walk, a
    persistent launch) at their defaults, as a nearer shape's winner is taken where the space has
    not that form of it."""
    space = tuple(space)
    for s in space:
        if config in (schedule_config(s), full_config(s)):
            return s
    if loose:
        for s in space:
            if schedule_config(s) == {k: v for k, v in config.items() if k not in s.quiet_fields()}:
                return s
    return None


def _field(schedule: Schedule, name: str):
    return getattr(schedule, name) if name in {f.name for f in fields(schedule)} else None


def knobs(schedule: Schedule) -> dict[str, object]:
    """The product-level knobs a schedule has: tile, pipeline_stages, vectorize, warps."""
    out: dict[str, object] = {}
    bm, bn, bk = (_field(schedule, n) for n in ("bm", "bn", "bk"))
    if bm is not None and bn is not None:
        out["tile"] = (bm, bn) if bk is None else (bm, bn, bk)
    if (stages := _field(schedule, "stages")) is not None:
        out["pipeline_stages"] = stages
    if (vec := _field(schedule, "vec")) is not None:
        out["vectorize"] = vec
    warps = _field(schedule, "warps")
    if warps is None and _field(schedule, "warps_m") is not None:
        warps = schedule.warps_m * schedule.warps_n
    if warps is None and isinstance(getattr(schedule, "threads", None), int):
        warps = schedule.threads // 32
    if warps is not None:
        out["warps"] = warps
    return out


# The values a knob can take in any kernel, with how to say so: what `search_space` accepts.
KNOB_VALUES = {
    "tile edge": (lambda v: v % 8 == 0 and v <= 256, "a multiple of 8 up to 256 (an MMA fragment is 8 wide; "
                                                     "a wgmma or a TMA box at most 256)"),
    "pipeline_stages": (lambda v: v <= 8, "1 to 8"),
    "vectorize": (lambda v: v & (v - 1) == 0 and v <= 16, "a power of two up to 16 (a load moves at most 16 bytes)"),
    "warps": (lambda v: v <= 32, "1 to 32 (a block holds at most 1024 threads)"),
}


@dataclass(frozen=True)
class SpaceRestriction:
    """What the user allows; None leaves a knob free. A tile of two numbers matches (bm, bn) at any bk."""
    tile_sizes: tuple[tuple[int, ...], ...] | None = None
    pipeline_stages: tuple[int, ...] | None = None
    vectorize: tuple[int, ...] | None = None
    warps: tuple[int, ...] | None = None

    @staticmethod
    def of(tile_sizes=None, pipeline_stages=None, vectorize=None, warps=None) -> SpaceRestriction:
        """From user lists, checked: `SpaceRestriction.of(tile_sizes=[(64, 64)], pipeline_stages=[2, 3])`.
        A value no kernel can have is refused here, not at the next compile."""
        def ints(name, values):
            if values is None:
                return None
            values = tuple(values) if isinstance(values, (tuple, list, range)) else (values,)   # 3 reads as [3]
            if not values or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                                     for v in values):
                raise ArgumentError(f"search_space: {name} must be a non-empty list of positive integers, got {values!r}")
            values = tuple(int(v) for v in values)
            if name in KNOB_VALUES:
                allowed, says = KNOB_VALUES[name]
                if bad := [v for v in values if not allowed(v)]:
                    raise ArgumentError(f"search_space: no kernel has {name} {bad[0]}", hint=f"{name}: {says}")
            return values
        tiles = None
        if tile_sizes is not None:
            listed = tile_sizes if isinstance(tile_sizes, (tuple, list)) else (tile_sizes,)
            tiles = tuple(tuple(t) if isinstance(t, (tuple, list)) else (t,) for t in listed)
            if not tiles or any(len(t) not in (2, 3) or ints("tile_sizes", t) is None for t in tiles):
                raise ArgumentError(f"search_space: tile_sizes must be a non-empty list of (bm, bn) or (bm, bn, bk), "
                                    f"got {tile_sizes!r}")
            tiles = tuple(ints("tile edge", t) for t in tiles)
        return SpaceRestriction(tiles, ints("pipeline_stages", pipeline_stages), ints("vectorize", vectorize),
                                ints("warps", warps))

    @property
    def is_free(self) -> bool:
        return all(v is None for v in (self.tile_sizes, self.pipeline_stages, self.vectorize, self.warps))

    def admits(self, schedule: Schedule) -> bool:
        k = knobs(schedule)
        if self.tile_sizes is not None and "tile" in k:
            if not any(k["tile"][:len(t)] == t for t in self.tile_sizes):
                return False
        for name in ("pipeline_stages", "vectorize", "warps"):
            allowed = getattr(self, name)
            if allowed is not None and name in k and k[name] not in allowed:
                return False
        return True

    def __str__(self) -> str:
        parts = [f"{n}={list(v)}" for n, v in (("tile_sizes", self.tile_sizes), ("pipeline_stages", self.pipeline_stages),
                                               ("vectorize", self.vectorize), ("warps", self.warps)) if v is not None]
        return ", ".join(parts) or "unrestricted"


@dataclass(frozen=True)
class RankedSpace:
    """A kernel's schedules that fit, fastest estimate first, and what was pruned with the reason."""
    template: Template
    op: KernelOp
    schedules: tuple[Schedule, ...]
    estimates: tuple[float, ...]              # µs, one per schedule
    default: Schedule                          # the cost model's pick among the template's defaults
    pruned: tuple[tuple[Schedule, str], ...]

    def __len__(self) -> int:
        return len(self.schedules)


def ranked_space(template: Template, op: KernelOp, arch: ArchSpec,
                 restriction: SpaceRestriction | None = None) -> RankedSpace:
    """`template`'s space for `op`, narrowed by `restriction`, with estimates, cheapest first; ties
    put the defaults first, then keep the template's order. Raises ArgumentError naming the op when
    the restriction leaves nothing."""
    restriction = restriction or SpaceRestriction()
    kept, pruned = [], []
    for s in template.space(op, arch):
        if not restriction.admits(s):
            pruned.append((s, f"outside the search space ({restriction})"))
            continue
        cost = schedule_cost(template, op, s, arch)
        if math.isfinite(cost.est_us):
            kept.append((s, cost.est_us))
        else:
            pruned.append((s, f"does not fit an SM of {arch.name} ({cost.smem_bytes} B smem, {cost.registers} "
                              "registers)"))
    if not kept:
        allowed = sorted({str(knobs(s)) for s, _ in pruned})[:6]
        raise ArgumentError(f"no schedule of the {template.kind_of(op)} kernel {op} is left in the search space "
                            f"({restriction}) on {arch.name}",
                            hint=f"widen the search space; schedules it has: {'; '.join(allowed)}")
    defaults = [s for s in template.schedules(op, arch) if any(s == k for k, _ in kept)]
    # among equal estimates the template's defaults come first, in their order: the cost model
    # cannot tell those schedules apart, and a default is what an untuned call runs
    rank = {s: i for i, s in enumerate(defaults)}
    kept.sort(key=lambda se: (se[1], rank.get(se[0], len(rank))))
    default = min(defaults, key=lambda s: dict(kept)[s]) if defaults else kept[0][0]
    return RankedSpace(template, op, tuple(s for s, _ in kept), tuple(e for _, e in kept), default, tuple(pruned))
