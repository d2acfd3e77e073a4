"""The persistent TMA GEMM kernel (gemm_tma_cuda.py, TmaSchedule(persistent=True)): a block per SM
slot walks tiles a grid apart, its stages and barrier phases running on from one tile to the next.
Run by the CPU emulator on an architecture of 2 SMs of 2 blocks (a wave of 4, or 2 for the blocks of
two consumer warpgroups) so every block walks several tiles, against float64 numpy; compiled by
NVRTC for sm_90a, ptxas's registers within the model's bound and no spills; and in the tuning space
only where the tiles outnumber a wave.

The emulator catches a wrong barrier parity, a stage never handed back (a deadlock), a tile's ones
row or origin computed from the wrong counter, and a stage handed back before the wgmmas reading it
retire (the arriving thread steps aside, the producer refills the stage, and the copy finds the
bytes still read). `bench sanitize --kernels variants` runs these kernels under compute-sanitizer
on a GPU."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import KernelSource, compile_cuda
from tessera_rw.codegen.emulator import EmulatorError
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.gemm import GemmTemplate, TmaSchedule
from tessera_rw.codegen.templates.gemm_variants import persistent_grid, tiles_of
from tessera_rw.tune.space import schedule_config
from tests.codegen.emulated_ops import bias_grad_transposed, transposed
from tests.codegen.schedule_check import check_schedules
from tests.codegen.test_template_contract import REGISTER_BOUND

BF16, F16, F32 = DType.bfloat16, DType.float16, DType.float32
TEMPLATE = GemmTemplate()
H100 = arch_named("h100")
SMALL = H100.model_copy(update={"sm_count": 2, "max_blocks_per_sm": 2})   # a wave of 4 blocks
TILE = TmaSchedule(64, 64, 64, 1, 1, 3)        # 48 KiB of stages: two blocks an SM
TWO_CONSUMERS = TmaSchedule(128, 64, 64, 2, 1, 3)   # setmaxnreg, 8 warps arriving on a stage's empty barrier

# tiles per block > 1 everywhere; K of 2 to 8 k-tiles over 3 stages, so a block's stages wrap
# inside a tile and across tiles
OPS = {
    "nn ragged 389x200x80 bf16": transposed((389, 80), (80, 200), BF16, BF16),
    "nn long k 200x200x520 bf16": transposed((200, 520), (520, 200), BF16, BF16),
    "tt batched 2x64x200x456 f16 -> f32": transposed((2, 64, 456), (456, 200), F16, F32, trans_a=True, trans_b=True),
    "nt bias gelu 130x260x136 bf16": transposed((130, 136), (136, 260), BF16, BF16, trans_b=True,
                                                extra=[((260,), BF16)], has_bias=True, activation="gelu"),
    "bias grad tn 200x136x200 bf16": bias_grad_transposed(200, 136, 200, BF16),
    "bias grad nn 200x136x200 bf16": KernelOp.of("matmul_bias_grad", (TensorType((200, 136), BF16),
                                                                       TensorType((136, 200), BF16)),
                                                 TensorType((201, 200), BF16), accum_dtype=None, trans_a=False),
}


def _run(op, arrays, schedule, arch):
    return emulator.run_emulated(op, arrays, schedule=schedule, arch=arch)


def _checked(name: str, tile: TmaSchedule) -> list[TmaSchedule]:
    persistent = replace(tile, persistent=True)
    return [persistent, replace(persistent, group=2)]


def kernels_checked(item) -> list[KernelSource]:
    """The kernels a selected test of this module runs (built beforehand: tests/conftest.py)."""
    if item.originalname != "test_a_persistent_kernel_walking_several_tiles_a_block_matches_the_reference":
        return []
    name, tile = item.callspec.params["name"], item.callspec.params["tile"]
    return [TEMPLATE.emit(OPS[name], s, SMALL) for s in _checked(name, tile)]


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.usefixtures("module_kernels_built")
@pytest.mark.parametrize("tile, wave", [(TILE, 4), (TWO_CONSUMERS, 2)], ids=["one-consumer", "two-consumers"])
@pytest.mark.parametrize("name", list(OPS))
def test_a_persistent_kernel_walking_several_tiles_a_block_matches_the_reference(name, tile, wave):
    op = OPS[name]
    persistent, walked = _checked(name, tile)
    assert TEMPLATE.valid(op, persistent, SMALL)
    assert tiles_of(op, persistent) > wave == persistent_grid(op, persistent, SMALL), name
    kernel = TEMPLATE.emit(op, persistent, SMALL)
    assert kernel.grid == (wave, 1, 1) and "tile += gridDim.x" in kernel.source
    check_schedules(TEMPLATE, op, [persistent, walked], SMALL, _run)


def test_fewer_tiles_than_a_wave_launch_one_block_a_tile():
    op = transposed((128, 64), (64, 128), BF16, BF16)       # 4 tiles of 64 x 64 on a wave of 4 blocks
    persistent = replace(TILE, persistent=True)
    assert persistent_grid(op, persistent, SMALL) == tiles_of(op, persistent) == 4
    assert TEMPLATE.emit(op, persistent, SMALL).grid == (4, 1, 1)


def _product(n: int) -> KernelOp:
    t = TensorType((n, n), BF16)
    return KernelOp.of("matmul", (t, t), t, accum_dtype=None)


def test_the_space_holds_the_persistent_form_only_where_tiles_outnumber_a_wave():
    big, small = _product(4096), _product(1024)          # 512 and 32 tiles of 128 x 256 on 132 SMs
    default = TEMPLATE.schedules(big, H100)[0]
    space = TEMPLATE.space(big, H100)
    forms = [s for s in space if isinstance(s, TmaSchedule) and s.persistent]
    assert replace(default, persistent=True) in forms
    assert {replace(s, persistent=False) for s in forms} <= set(space)      # each one's own launch is there too
    assert not any(getattr(s, "persistent", False) for s in TEMPLATE.space(small, H100))
    assert not any(getattr(s, "persistent", False) for s in TEMPLATE.schedules(big, H100))   # never a default
    assert schedule_config(replace(default, persistent=True))["persistent"] is True
    assert "persistent" not in schedule_config(default)
    assert TEMPLATE.emit(big, replace(default, persistent=True), H100).name.endswith("_persistent")


@pytest.mark.parametrize("schedule", [TmaSchedule(persistent=True), TmaSchedule(128, 128, 64, 1, 1, 6, persistent=True),
                                      TmaSchedule(128, 256, 64, 2, 1, 4, group=4, persistent=True)],
                         ids=lambda s: s.describe())
def test_persistent_kernels_compile_for_sm_90a_without_spills(schedule):
    op = _product(4096)
    compiled = compile_cuda(TEMPLATE.emit(op, schedule, H100), H100.sm)
    res = TEMPLATE.resources(op, schedule, H100)
    assert compiled.spill_bytes == 0, f"{schedule.describe()}: ptxas spills {compiled.spill_bytes} bytes"
    error = (res.registers - compiled.registers) / compiled.registers
    assert abs(error) <= REGISTER_BOUND, f"{schedule.describe()}: estimate {res.registers}, ptxas {compiled.registers}"


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_a_tiles_last_stage_handed_back_before_its_mmas_retire_stops_the_run():
    op = OPS["nn long k 200x200x520 bf16"]
    source = TEMPLATE.emit(op, replace(TILE, persistent=True), SMALL)
    release = "if (lane == 0) mbar_arrive(&empty[(it - 1) % STAGES]);   // the last stage"
    assert release in source.source
    wait = "        wgmma_wait<0>();"
    early = source.source.replace(release, "").replace(wait, f"        {release}\n{wait}")
    mutated = KernelSource(source.name + "_early", early.replace(source.name, source.name + "_early"), source.threads,
                           source.grid, source.dynamic_smem, target=source.target, tensor_maps=source.tensor_maps)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(t.shape).astype(ml_dtypes.bfloat16) for t in op.operands)
    with pytest.raises(EmulatorError, match="an issued wgmma still reads"):
        emulator.build(mutated)([a, b, np.zeros(op.result.shape, ml_dtypes.bfloat16)])
