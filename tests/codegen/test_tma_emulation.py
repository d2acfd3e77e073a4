"""The emulator's TMA copies and mbarriers, and the TMA GEMM kernel's pipeline under it.

A TMA box lands in shared memory in the 128-byte swizzled layout (checked here against the layout
written out independently: row r's 16-byte chunk c at chunk c ^ (r % 8)), zero past the tensor's
edges; mbarrier phases complete on arrivals and transaction bytes; and the ways a warp-specialized
pipeline goes wrong (a stage released before its MMAs retire, a wait on the wrong phase, the wrong
byte count, barriers used before their init is visible) stop the run instead of passing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.linalg import read_as
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import KernelSource, compile_cuda
from tessera_rw.codegen.emulator import EmulatorError, build
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.gemm import GemmTemplate
from tessera_rw.codegen.templates.gemm_footprint import TmaSchedule
from tessera_rw.codegen.tensor_map import TensorMapSpec

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")

# One thread copies the box at (X0, Y0[, Z0]) of a bf16 tensor into a 1024-byte aligned tile and
# every thread writes the tile's bytes out as they lie: what the TMA unit wrote where.
TMA_COPY = r"""
extern "C" __global__ void KERNEL(const bf16_t* A, unsigned short* out, const __grid_constant__ TmaMap map) {
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* tile = smem + ((1024 - (smem_addr(smem) & 1023)) & 1023);
    unsigned long long* bar = (unsigned long long*)(tile + BYTES);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, BYTES);
        LOAD;
    }
    mbar_wait(bar, 0);
    for (int i = threadIdx.x; i < BYTES / 2; i += blockDim.x) out[i] = ((const unsigned short*)tile)[i];
}
"""


def copy_box(name: str, tensor: np.ndarray, spec: TensorMapSpec, load: str) -> np.ndarray:
    """The tile's 16-bit words after one TMA copy of `spec`'s box from `tensor`."""
    body = (TMA_COPY.replace("KERNEL", name).replace("BYTES", str(spec.box_bytes)).replace("LOAD", load))
    source = KernelSource(name, body, threads=64, dynamic_smem=spec.box_bytes + 1024 + 8, target="sm_90a",
                          tensor_maps=(spec,))
    out = np.zeros(spec.box_bytes // 2, np.uint16)
    build(source)([tensor, out])
    return out, source


def swizzled(box: np.ndarray) -> np.ndarray:
    """A box of 64-wide bf16 rows as 128-byte swizzling lays it out: row r's chunk c (8 values) at
    chunk c ^ (r % 8) of the row (the tile starts on a 1024-byte atom)."""
    rows = box.reshape(-1, 8, 8)
    out = np.empty_like(rows)
    for r in range(rows.shape[0]):
        for c in range(8):
            out[r, c ^ (r % 8)] = rows[r, c]
    return out.reshape(-1)


def test_a_tma_box_lands_swizzled_and_zero_filled_past_the_edges():
    rng = np.random.default_rng(0)
    # the map covers 100 columns of rows 104 long (208 bytes apart): 40 x 100 of the stored 40 x 104
    a = rng.standard_normal((40, 104)).astype(ml_dtypes.bfloat16)
    bits = a.view(np.uint16)
    spec = TensorMapSpec(0, 2, dims=(100, 40), strides=(208,), box=(64, 16))
    got, source = copy_box("tma_copy_2d", bits, spec, "tma_load_2d(tile, &map, 64, 32, bar)")
    window = np.zeros((16, 64), np.uint16)           # columns 64..127 of rows 32..47: past both edges of the map
    window[:8, :36] = bits[32:40, 64:100]
    np.testing.assert_array_equal(got, swizzled(window))
    assert compile_cuda(source, "sm_90").spill_bytes == 0      # the same text is a kernel NVRTC builds


def test_a_3d_box_reads_its_batch():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 16, 64)).astype(ml_dtypes.bfloat16)
    bits = a.view(np.uint16)
    spec = TensorMapSpec(0, 2, dims=(64, 16, 3), strides=(128, 2048), box=(64, 8, 1))
    got, _ = copy_box("tma_copy_3d", bits, spec, "tma_load_3d(tile, &map, 0, 8, 2, bar)")
    np.testing.assert_array_equal(got, swizzled(bits[2, 8:16]))


def test_a_box_nobody_waits_for_stops_the_run_when_the_block_ends():
    """The hardware may write a copy's bytes any time before its phase completes, so the emulator
    lands them when a wait first sees the phase complete; a copy no thread waits for is still in
    flight when the block exits, which on the device writes into the next block's shared memory."""
    bits = np.random.default_rng(3).standard_normal((16, 64)).astype(ml_dtypes.bfloat16).view(np.uint16)
    spec = TensorMapSpec(0, 2, dims=(64, 16), strides=(128,), box=(64, 16))
    body = TMA_COPY.replace("    mbar_wait(bar, 0);\n", "").replace("KERNEL", "tma_unwaited")
    assert body != TMA_COPY.replace("KERNEL", "tma_unwaited")
    source = KernelSource("tma_unwaited", body.replace("BYTES", str(spec.box_bytes)).replace("LOAD", (
        "tma_load_2d(tile, &map, 0, 0, bar)")), threads=64, dynamic_smem=spec.box_bytes + 1024 + 8,
        target="sm_90a", tensor_maps=(spec,))
    with pytest.raises(EmulatorError, match="in flight"):
        build(source)([bits, np.zeros(spec.box_bytes // 2, np.uint16)])
    waited, _ = copy_box("tma_waited", bits, spec, "tma_load_2d(tile, &map, 0, 0, bar)")
    np.testing.assert_array_equal(waited, swizzled(bits))


@pytest.mark.parametrize("load, message", [
    # the barrier expects more bytes than the copy brings: its phase never completes
    ("mbar_arrive_expect_tx(bar, 2 * BYTES); tma_load_2d(tile, &map, 0, 0, bar)", "deadlock"),
    # a copy into a tile that is not 128-byte aligned
    ("tma_load_2d(tile + 16, &map, 0, 0, bar)", "not 128-byte aligned"),
])
def test_tma_misuse_stops_the_run(load, message):
    bits = np.zeros((16, 64), np.uint16)
    spec = TensorMapSpec(0, 2, dims=(64, 16), strides=(128,), box=(64, 16))
    body = TMA_COPY.replace("mbar_arrive_expect_tx(bar, BYTES);\n        LOAD;", f"{load};")
    with pytest.raises(EmulatorError, match=message):
        name = f"tma_misuse_{abs(hash(load)) % 10_000}"
        source = KernelSource(name, body.replace("KERNEL", name).replace("BYTES", str(spec.box_bytes)), threads=64,
                              dynamic_smem=spec.box_bytes + 1024 + 8, target="sm_90a", tensor_maps=(spec,))
        build(source)([bits, np.zeros(spec.box_bytes // 2, np.uint16)])


def test_a_tensor_map_that_breaks_the_hardware_rules_is_refused():
    with pytest.raises(TesseraError, match="multiples of 16 bytes"):
        TensorMapSpec(0, 2, dims=(100, 40), strides=(200 + 2,), box=(64, 16))
    with pytest.raises(TesseraError, match="span the 128-byte swizzle"):
        TensorMapSpec(0, 2, dims=(100, 40), strides=(208,), box=(32, 16))
    with pytest.raises(TesseraError, match="at most 256"):
        TensorMapSpec(0, 2, dims=(100, 400), strides=(208,), box=(64, 512))


# -- the TMA GEMM kernel's pipeline -----------------------------------------------------------------

H100 = arch_named("h100")
SCHEDULE = TmaSchedule(64, 128, 64, 1, 1, 3)       # 3 stages over 9 k-tiles: each refilled twice


def _product():
    a, b = TensorType((72, 520), DType.bfloat16), TensorType((520, 136), DType.bfloat16)
    op = KernelOp.of("matmul", (a, b), TensorType((72, 136), DType.float32), accum_dtype=None)
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(t.shape).astype(ml_dtypes.bfloat16) for t in op.operands]
    return op, arrays


def run_mutated(old: str, new: str) -> np.ndarray:
    """The TMA kernel of a 72x136x520 product with `old` replaced by `new` in its source."""
    op, (a, b) = _product()
    source = GemmTemplate().emit(op, SCHEDULE, H100)
    assert old in source.source
    mutated = KernelSource(source.name + "_mutated", source.source.replace(old, new).replace(
        source.name, source.name + "_mutated"), source.threads, source.grid, source.dynamic_smem,
        target=source.target, tensor_maps=source.tensor_maps)
    out = np.full((72, 136), np.nan, np.float32)
    build(mutated)([a, b, out])
    return out


def test_the_tma_kernel_matches_the_reference():
    op, (a, b) = _product()
    out = np.full((72, 136), np.nan, np.float32)
    build(GemmTemplate().emit(op, SCHEDULE, H100))([a, b, out])
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("old, new, message", [
    # a stage released as soon as its MMAs are issued: the producer refills it under them
    ("if (kt > 0 && lane == 0) mbar_arrive(&empty[(kt - 1) % STAGES]);",
     "if (lane == 0) mbar_arrive(&empty[kt % STAGES]);", "an issued wgmma still reads"),
    # a stage handed back one k-tile too early, its MMAs still in flight (retiring all but two groups)
    ("wgmma_wait<1>();", "wgmma_wait<2>();", "an issued wgmma still reads"),
    # the consumers wait on the phase after the one their tile completes
    ("mbar_wait(&full[s], (kt / STAGES) & 1);", "mbar_wait(&full[s], (kt / STAGES + 1) & 1);", "deadlock"),
    # the producer expects half a stage's bytes: the phase never completes
    ("mbar_arrive_expect_tx(&full[s], STAGE_BYTES);", "mbar_arrive_expect_tx(&full[s], STAGE_BYTES / 2);",
     "deadlock"),
    # one consumer warp fewer counted: a stage is refilled before the last warp has read it (which
    # then waits on a phase long past) or while its MMAs still read it
    ("mbar_init(&empty[s], 4 * CONSUMERS);", "mbar_init(&empty[s], 4 * CONSUMERS - 1);", "deadlock|still reads"),
    # the consumers issue a stage's MMAs without waiting for it to land
    ("mbar_wait(&full[s], (kt / STAGES) & 1);", "", "still reads|yet to land"),
    # the barriers used before the __syncthreads that follows their init
    ("    __syncthreads();\n\n    if (warpgroup == CONSUMERS)", "\n    if (warpgroup == CONSUMERS)",
     "before mbarrier.init"),
])
def test_a_broken_tma_pipeline_stops_the_run(old, new, message):
    with pytest.raises(EmulatorError, match=message):
        run_mutated(old, new)


def test_a_tma_schedule_is_refused_where_tensor_maps_cannot_load():
    # A stored [K, M] with M = 70: 140-byte rows, which a tensor map's stride cannot be
    a = read_as(TensorType((70, 450), DType.bfloat16), True)
    op = KernelOp.of("gemm", (a, TensorType((450, 136), DType.bfloat16)), TensorType((70, 136), DType.bfloat16),
                     scale=1.0, activation="none", has_bias=False, has_residual=False, accum_dtype=None,
                     dtype=DType.bfloat16, trans_a=True)
    template = GemmTemplate()
    assert not any(isinstance(s, TmaSchedule) for s in template.schedules(op, H100))
    with pytest.raises(TesseraError, match="16-byte aligned"):
        template.emit(op, SCHEDULE, H100)


def test_the_driver_sees_the_mapped_tensor_outermost_first_in_bytes():
    from tessera_rw.codegen.tensor_map import _MappedTensor
    spec = TensorMapSpec(1, 1, dims=(4096, 1024, 3), strides=(4096, 4096 * 1024), box=(128, 256, 1))
    view = _MappedTensor(spec, 0x7F00_0000_0000).__cuda_array_interface__
    assert view["shape"] == (3, 1024, 4096) and view["strides"] == (4096 * 1024, 4096, 1)
    assert view["typestr"] == "|u1" and view["data"] == (0x7F00_0000_0000, False)


def test_a_product_s_tensor_maps_cover_its_operands_exactly():
    from tessera_rw.codegen.templates.gemm_problem import GemmProblem
    from tessera_rw.codegen.templates.gemm_tma_cuda import tensor_maps
    # A batched and stored [K, M]; B shared by every batch and stored [N, K]
    a, b = read_as(TensorType((4, 256, 512), DType.float16), True), read_as(TensorType((512, 384), DType.float16), True)
    op = KernelOp.of("gemm", (a, b), TensorType((4, 256, 384), DType.float16), scale=1.0, activation="none",
                     has_bias=False, has_residual=False, accum_dtype=None, dtype=DType.float16, trans_a=True,
                     trans_b=True)
    map_a, map_b = tensor_maps(GemmProblem.of(op), TmaSchedule(128, 128, 64, 2, 1, 4))
    assert (map_a.dims, map_a.strides, map_a.box) == ((256, 512, 4), (512, 512 * 512), (64, 64, 1))
    assert (map_b.dims, map_b.strides, map_b.box) == ((512, 384), (1024,), (64, 128))
    assert [m.operand for m in (map_a, map_b)] == [0, 1]


@pytest.mark.parametrize("sync", [True, False], ids=["synced", "no warpgroup barrier"])
def test_a_bias_gradient_s_ones_row_is_written_into_the_landed_tile_before_the_mmas(sync):
    # dW and db of X [520, 72] and dY [520, 136]: A = Xᵀ read in place, its row 72 the ones
    x = TensorType((520, 72), DType.bfloat16)
    op = KernelOp.of("matmul_bias_grad", (x, TensorType((520, 136), DType.bfloat16)),
                     TensorType((73, 136), DType.bfloat16), accum_dtype=None, trans_a=True)
    source = GemmTemplate().emit(op, SCHEDULE, H100)
    barrier = "warpgroup_sync(1 + warpgroup);"
    assert barrier in source.source
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(t.shape).astype(ml_dtypes.bfloat16) for t in op.operands)
    out = np.full((73, 136), np.nan, ml_dtypes.bfloat16)
    if sync:
        build(source)([a, b, out])
        reference = np.vstack([a.astype(np.float64).T @ b.astype(np.float64), b.astype(np.float64).sum(axis=0)])
        np.testing.assert_allclose(out.astype(np.float64), reference, rtol=2e-2, atol=0.5)
        return
    # without the barrier, a warp issues its MMAs before another warp has written its share of the row
    unsynced = KernelSource(source.name + "_unsynced", source.source.replace(barrier, "").replace(
        source.name, source.name + "_unsynced"), source.threads, source.grid, source.dynamic_smem,
        target=source.target, tensor_maps=source.tensor_maps)
    with pytest.raises(EmulatorError, match="changed before wgmma.wait_group"):
        build(unsynced)([a, b, out])
