"""The GEMM grid's walk over output tiles (gemm_tile_order.py): the traffic model picks the group of
tile rows that reads the fewest bytes, and kernels walking groups (a short last group included)
still cover every tile once: the mma.sync, wgmma and TMA kernels, run by the CPU emulator on an
architecture whose L2 is too small to hold the operands, against float64 numpy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.gemm import GemmSchedule, GemmTemplate, TmaSchedule, WgmmaSchedule, _tile_order
from tessera_rw.codegen.templates.gemm_tile_order import other_groups, tile_order, tile_origin
from tessera_rw.codegen.templates.gemm_variants import walked
from tests.codegen.schedule_check import check_schedules

MB = 1 << 20


def test_operands_that_fit_in_l2_are_read_once_in_row_major_order():
    order = tile_order(tiles_m=32, tiles_n=32, wave=132, a_bytes=8 * MB, b_bytes=8 * MB, l2_bytes=50 * MB)
    assert (order.group, order.a_reads, order.b_reads) == (1, 1, 1)


def test_row_major_order_reads_b_once_per_wave_of_tile_rows():
    # 8192³ bf16 in 128 x 256 tiles: a wave of 132 blocks spans 4 of the 64 tile rows, all 32 columns
    order = tile_order(64, 32, 132, 128 * MB, 128 * MB, 50 * MB, group=1)
    assert (order.a_reads, order.b_reads) == (1, 16)


def test_groups_of_tile_rows_make_a_wave_a_square_patch():
    # 16 rows x 8 columns a wave: A's panels come 32 / 8 times, B's 64 / 16 times
    chosen = tile_order(64, 32, 132, 128 * MB, 128 * MB, 50 * MB)
    assert (chosen.group, chosen.a_reads, chosen.b_reads) == (16, 4, 4)
    every = [tile_order(64, 32, 132, 128 * MB, 128 * MB, 50 * MB, group=g) for g in (1, 2, 4, 8, 16, 32, 64)]
    assert chosen.hbm_bytes(128 * MB, 128 * MB) == min(o.hbm_bytes(128 * MB, 128 * MB) for o in every)
    assert chosen.hbm_bytes(128 * MB, 128 * MB) < every[0].hbm_bytes(128 * MB, 128 * MB) / 2


def test_an_operand_that_fits_alone_is_read_once():
    order = tile_order(64, 32, 132, 16 * MB, 128 * MB, 50 * MB)
    assert order.a_reads == 1 and order.b_reads == 1


def test_the_h100_8192_cube_walks_groups_and_its_modelled_traffic_drops():
    t = TensorType((8192, 8192), DType.bfloat16)
    op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
    arch = arch_named("h100")
    schedule = GemmTemplate().schedules(op, arch)[0]
    order = _tile_order(op, schedule, arch)
    assert order.group > 1
    row_major = tile_order(8192 // schedule.bm, 8192 // schedule.bn, arch.sm_count, t.nbytes, t.nbytes,
                           arch.l2_bytes, group=1)
    assert order.hbm_bytes(t.nbytes, t.nbytes) < row_major.hbm_bytes(t.nbytes, t.nbytes)
    assert f"GROUP = {order.group};" in GemmTemplate().emit(op, schedule, arch).source


def test_one_group_emits_the_plain_row_major_walk():
    assert "GROUP" not in tile_origin(1)
    assert "constexpr int GROUP = 4;" in tile_origin(4)


# ---- kernels walking groups, run by the emulator ----------------------------------------------------

def _small_l2(arch_name: str):
    """The architecture with an L2 of 4 KiB and 2 SMs of 2 blocks: no operand stays in L2, a wave
    is 4 blocks."""
    return arch_named(arch_name).model_copy(update={"l2_bytes": 4096, "sm_count": 2, "max_blocks_per_sm": 2})


def _product(m: int, n: int, k: int) -> KernelOp:
    a, b = TensorType((m, k), DType.bfloat16), TensorType((k, n), DType.bfloat16)
    return KernelOp.of("matmul", (a, b), TensorType((m, n), DType.bfloat16), accum_dtype=None)


def _run(op, arrays, schedule, arch):
    return emulator.run_emulated(op, arrays, schedule=schedule, arch=arch)


CASES = {
    "mma.sync": ("a100", _product(6 * 32 + 9, 4 * 32 + 3, 72), GemmSchedule(32, 32, 32, 1, 1, 3)),
    "wgmma": ("h100", _product(6 * 64 + 5, 3 * 64 + 8, 80), WgmmaSchedule(64, 64, 64, 1, 1, 3)),
    "tma": ("h100", _product(6 * 64 + 5, 3 * 64 + 8, 80), TmaSchedule(64, 64, 64, 1, 1, 3)),
}


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("kind", list(CASES))
def test_a_kernel_walking_groups_with_a_short_last_group_covers_every_tile(kind):
    arch_name, op, schedule = CASES[kind]
    arch = _small_l2(arch_name)
    template = GemmTemplate()
    group = _tile_order(op, schedule, arch).group
    tiles_m = -(-op.result.shape[0] // schedule.bm)
    assert 1 < group < tiles_m and tiles_m % group, f"{kind}: group {group} over {tiles_m} tile rows"
    check_schedules(template, op, [schedule], arch, _run)


# ---- a schedule's own walk: what the tuner times beside the model's pick ------------------------------

def test_a_schedule_fixing_its_group_walks_that_group():
    t = TensorType((8192, 8192), DType.bfloat16)
    op = KernelOp.of("matmul", (t, t), t, accum_dtype=None)
    arch, template = arch_named("h100"), GemmTemplate()
    schedule = template.schedules(op, arch)[0]
    picked = _tile_order(op, schedule, arch).group
    for group in {1, 4, 2 * picked} - {picked}:
        walked = replace(schedule, group=group)
        assert _tile_order(op, walked, arch).group == group
        assert walked.describe() == f"{schedule.describe()} group={group}"
        source = template.emit(op, walked, arch).source
        assert ("int GROUP" not in source) if group == 1 else (f"int GROUP = {group};" in source)
        assert template.emit(op, walked, arch).name.endswith(f"_group{group}")


def test_other_groups_skip_walks_that_cannot_differ():
    assert other_groups(32, 32, 132, 8 * MB, 8 * MB, 50 * MB) == ()        # both fit in L2: read once
    assert other_groups(1, 32, 132, 128 * MB, 128 * MB, 50 * MB) == ()     # one tile row: one order
    assert other_groups(64, 1, 132, 128 * MB, 128 * MB, 50 * MB) == ()     # one tile column: one order
    picked = tile_order(64, 32, 132, 128 * MB, 128 * MB, 50 * MB).group
    assert other_groups(64, 32, 132, 128 * MB, 128 * MB, 50 * MB) == tuple(g for g in (1, 2, 4, 8, 16, 32, 64)
                                                                           if g != picked)


def test_the_space_holds_each_default_under_every_other_walk_and_only_where_walks_differ():
    template, arch = GemmTemplate(), arch_named("h100")
    big, small = _product(4096, 4096, 4096), _product(2048, 2048, 2048)
    space, defaults = template.space(big, arch), template.schedules(big, arch)
    for d in defaults:       # the first default's kernel (TMA on sm_90) walks; mma.sync's tiles there do not
        walks = {s.group for s in space if s.group and replace(s, group=0) == d}
        picked = _tile_order(big, d, arch).group
        others = other_groups(*walked(big, d, arch))
        assert walks == (set(others) if type(d) is type(defaults[0]) else set()), d
        assert picked not in walks
    assert not any(s.group for s in template.space(small, arch))     # 8 MiB operands stay in L2
    assert not template.valid(big, replace(defaults[0], group=-1), arch)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("kind", list(CASES))
def test_kernels_walking_every_other_group_cover_every_tile(kind):
    arch_name, op, schedule = CASES[kind]
    arch = _small_l2(arch_name)
    template = GemmTemplate()
    walks = [s for s in template.space(op, arch) if s.group and replace(s, group=0) == schedule]
    if not walks:          # the CASES schedule is not a default: time its walks directly
        walks = [replace(schedule, group=g) for g in other_groups(*walked(op, schedule, arch))]
    assert len(walks) >= 2, kind
    check_schedules(template, op, walks, arch, _run)
