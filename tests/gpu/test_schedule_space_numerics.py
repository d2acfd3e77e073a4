"""Schedules of the tuning space beyond the defaults compute what the defaults do: for every GEMM and
attention sample, three non-default schedules of this GPU's space run on random inputs (never zero,
the output poisoned first) and are checked against the op's float64 numpy reference at the output
dtype's tolerance (tessera_rw/codegen/kernel_check.py), as tests/gpu/test_kernel_numerics.py checks
the defaults. The failures of every schedule of a sample are reported together.
"""

from __future__ import annotations

import pytest

from tests.codegen.test_schedule_spaces import beyond_defaults
from tests.gpu.test_kernel_numerics import check_schedules
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.gemm import GemmTemplate

pytestmark = pytest.mark.gpu

PER_SAMPLE = 3
SAMPLES = [pytest.param(t, i, id=f"{type(t).__name__}-{i}-{op.op}")
           for t in (GemmTemplate(), FlashAttentionTemplate()) for i, op in enumerate(t.samples())]


@pytest.mark.parametrize("template, index", SAMPLES)
def test_schedules_beyond_the_defaults_match_the_reference(template, index):
    from tessera_rw.codegen.arch import current_arch
    op = template.samples()[index]
    arch = current_arch()
    picked = beyond_defaults(template, op, arch, PER_SAMPLE)
    assert picked, f"{type(template).__name__} has nothing beyond its defaults for {op} on {arch.name}"
    check_schedules(template, op, picked, arch)


def _plain(schedule):
    """The schedule as a default is: the L2 model's walk, one block a tile."""
    from dataclasses import replace
    plain = replace(schedule, group=0)
    return replace(plain, persistent=False) if hasattr(plain, "persistent") else plain


def test_the_defaults_other_walks_and_persistent_forms_match_the_reference():
    """gemm_variants.py: a default tile walked in another order, or by a persistent grid, on the GPU
    (every sample whose space has them; the 4096³ bf16 product has both on sm_90)."""
    from tessera_rw.codegen.arch import current_arch
    template, arch = GemmTemplate(), current_arch()
    walks = persistent_forms = 0
    for op in template.samples():
        defaults = template.schedules(op, arch)
        forms = [s for s in template.space(op, arch) if s not in defaults and _plain(s) in defaults]
        persistent = [s for s in forms if getattr(s, "persistent", False)]
        picked = list(dict.fromkeys(persistent[:2] + forms[:2]))
        if picked:
            check_schedules(template, op, picked, arch)
            walks += any(s.group for s in picked)
            persistent_forms += bool(persistent)
    assert walks, f"no GEMM sample has other walks on {arch.name}"
    assert persistent_forms or arch.compute_capability != (9, 0), f"no persistent GEMM was checked on {arch.name}"


def test_the_attention_defaults_producer_forms_match_the_reference():
    """attention_tma_cuda.py: each attention sample's default wgmma schedules in their producer forms
    (a producer warpgroup's TMA copies, the consumers taking turns or not) on the GPU; sm_90 only."""
    from tessera_rw.codegen.arch import current_arch
    template, arch = FlashAttentionTemplate(), current_arch()
    if arch.compute_capability != (9, 0):
        pytest.skip(f"{arch.name} has no TMA: the producer forms are sm_90's")
    checked = 0
    for op in template.samples():
        forms = [v for d in template.schedules(op, arch) for v in template.variants(op, d, arch)]
        if forms:
            check_schedules(template, op, forms[:4], arch)
            checked += 1
    assert checked >= 5, f"only {checked} attention samples have producer forms on {arch.name}"
