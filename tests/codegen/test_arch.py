"""Architecture specs: the published figures, detection by device name, TESSERA_ARCH."""

import pytest
from pydantic import ValidationError

from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import (KNOWN_ARCHS, ArchError, MathUnit, arch_for_device, arch_named, current_arch,
                                     target_arch, tensor_unit)


def test_every_required_gpu_is_known_with_its_compute_capability():
    expected = {"A100-SXM": "sm_80", "L4": "sm_89", "RTX-4090": "sm_89", "H100-SXM": "sm_90",
                "H100-PCIe": "sm_90", "H200": "sm_90", "B200": "sm_100"}
    assert {a.name: a.sm for a in KNOWN_ARCHS} == expected


@pytest.mark.parametrize("arch", KNOWN_ARCHS, ids=lambda a: a.name)
def test_specs_are_consistent(arch):
    peaks = arch.peak_tflops
    assert peaks[MathUnit.BF16] >= peaks[MathUnit.TF32] >= peaks[MathUnit.FP32] > 0
    if MathUnit.FP8 in peaks:
        assert peaks[MathUnit.FP8] == pytest.approx(2 * peaks[MathUnit.BF16], rel=0.01)
    assert arch.smem_per_block <= arch.smem_per_sm
    assert arch.registers_per_sm == 65536 and arch.registers_per_thread == 255
    assert 32 <= arch.max_warps_per_sm <= 64
    assert arch.l2_bytes >= 40 * 2**20 and arch.hbm_gbps >= 300


def test_h100_figures_and_the_ridge_point():
    h100 = arch_named("h100")
    assert (h100.sm_count, h100.hbm_gbps, h100.l2_bytes) == (132, 3350, 50 * 2**20)
    assert h100.peak_flops(DType.bfloat16) == pytest.approx(989.4e12)
    assert h100.peak_flops("float32") == pytest.approx(66.9e12)       # fp32 products stay off tensor cores
    assert 250 < h100.ridge < 350                                      # bf16 FLOPs per HBM byte
    assert arch_named("H200").hbm_gbps > h100.hbm_gbps and arch_named("H200").peak_tflops == h100.peak_tflops


def test_a_missing_unit_is_a_clear_error():
    with pytest.raises(ArchError, match="A100-SXM has no fp8 math unit"):
        arch_named("a100").peak_flops(MathUnit.FP8)
    assert tensor_unit(DType.float8_e4m3) is MathUnit.FP8
    assert tensor_unit(DType.float32, allow_tf32=True) is MathUnit.TF32


def test_specs_are_frozen_and_validated():
    h100 = arch_named("h100")
    with pytest.raises(ValidationError):
        h100.sm_count = 1
    with pytest.raises(ValidationError):
        type(h100)(name="x", device_names=("x",), compute_capability=(9, 0), sm_count="many", clock_mhz=1,
                   peak_tflops={}, hbm_gbps=1, l2_bytes=1, smem_per_sm=1, smem_per_block=1)
    assert {h100: 1}[arch_named("H100-SXM")] == 1


@pytest.mark.parametrize("device, cc, name", [
    ("NVIDIA H100 80GB HBM3", (9, 0), "H100-SXM"), ("NVIDIA H100 PCIe", (9, 0), "H100-PCIe"),
    ("NVIDIA H200", (9, 0), "H200"), ("NVIDIA A100-SXM4-80GB", (8, 0), "A100-SXM"), ("NVIDIA L4", (8, 9), "L4"),
    ("NVIDIA GeForce RTX 4090", (8, 9), "RTX-4090"), ("NVIDIA B200", (10, 0), "B200")])
def test_detection_by_device_name_and_capability(device, cc, name):
    assert arch_for_device(device, cc).name == name


def test_an_unknown_device_lists_the_known_ones_and_how_to_add_one():
    with pytest.raises(ArchError) as e:
        arch_for_device("NVIDIA GeForce GTX 1080", (6, 1))
    text = str(e.value)
    assert "GTX 1080" in text and "sm_61" in text and "H100-SXM" in text and "ArchSpec" in text
    with pytest.raises(ArchError, match="unknown architecture 'tpu'.*known: A100-SXM"):
        arch_named("tpu")


def test_tessera_arch_overrides_detection(monkeypatch):
    assert current_arch({"TESSERA_ARCH": "l4"}).name == "L4"
    monkeypatch.setenv("TESSERA_ARCH", "B200")
    assert target_arch().name == "B200"
    monkeypatch.setenv("TESSERA_ARCH", "nonsense")
    with pytest.raises(ArchError):
        target_arch()


@pytest.mark.parametrize("threads, registers, smem, blocks", [
    (256, 128, 0, 2),              # the register file: 8 warps x 4096 registers, twice
    (256, 64, 0, 4),
    (128, 32, 0, 16),              # warps: 64 / 4
    (64, 32, 0, 32),               # the block cap
    (128, 33, 0, 12),              # 33 registers take 40 per thread: allocated per warp in units of 256
    (128, 32, 100 * 1024, 2),      # shared memory: 228 KiB over 100
    (1024, 32, 0, 2),
    (1056, 32, 0, 0),              # over 1024 threads: none fits
    (128, 32, 228 * 1024, 0),      # over the 227 KiB a block may have
])
def test_resident_blocks_follow_the_occupancy_rules(threads, registers, smem, blocks):
    assert arch_named("H100-SXM").resident_blocks(threads, registers, smem) == blocks
