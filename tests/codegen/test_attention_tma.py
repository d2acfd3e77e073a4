"""The producer form of sm_90's wgmma FlashAttention kernel (attention_tma_cuda.py): a producer
warpgroup loading Q, K and V with TMA copies, handed over by mbarriers. Under the CPU emulator it
matches float64 numpy (head dims 64, 128 and 256, two to five stages, the consumers taking turns or
not, causal, masks, GQA, ragged key tiles, the logsumexp output), and the ways its pipeline goes
wrong fail; NVRTC and ptxas build it for sm_90a without spills or serialized wgmmas, launching with
the registers its setmaxnreg split assumes; the tuning space holds it beside the cp.async kernel
where tensor maps can load the operands, and records name both forms."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.compile import compile_cuda
from tessera_rw.codegen.emulator import EmulatorError, build
from tessera_rw.codegen.kernel_check import check, expected
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.templates.attention import FlashAttentionTemplate
from tessera_rw.codegen.templates.attention_problem import WarpgroupAttentionSchedule
from tessera_rw.codegen.templates.warp_specialization import registers_at_launch
from tessera_rw.tune.space import find_schedule, schedule_config
from tests.codegen.emulated_attention_ops import ATTENTION_OPS, BF16, BOOL, F16, attention
from tests.codegen.schedule_check import check_schedules, rng_for

H100, A100 = arch_named("h100"), arch_named("a100")
TEMPLATE = FlashAttentionTemplate()
needs_emulator = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def producer_forms(op, arch=H100) -> list[WarpgroupAttentionSchedule]:
    return [s for s in TEMPLATE.space(op, arch) if getattr(s, "producer", False)]


def picked_forms(op) -> list[WarpgroupAttentionSchedule]:
    """The first and last producer forms of the op's space, and its first of consumers taking
    turns and of two stages, where it has them."""
    forms = producer_forms(op)
    pingpong = [s for s in forms if s.pingpong]
    two = [s for s in forms if s.stages == 2]
    return list(dict.fromkeys(forms[:1] + forms[-1:] + pingpong[:1] + two[:1]))


EMULATED = {name: op for name, op in ATTENTION_OPS.items() if TEMPLATE.accepts(op) and producer_forms(op)}


def test_the_emulated_ops_cover_what_the_producer_kernel_takes():
    forms = [s for op in EMULATED.values() for s in picked_forms(op)]
    assert {s.consumers for s in forms} == {2} and {s.pingpong for s in forms} == {False, True}
    assert 2 in {s.stages for s in forms}
    assert {op.operands[0].shape[-1] for op in EMULATED.values()} == {64, 128, 256}
    ops = EMULATED.values()
    assert any(o.attr_map.get("causal") for o in ops) and any(o.attr_map.get("has_mask") for o in ops)
    assert any(o.attr_map.get("window") for o in ops), "a sliding window: the walk starts past key 0"
    assert any(o.op == "flash_attention_lse" for o in ops)
    assert any(o.operands[0].shape[1] != o.operands[1].shape[1] for o in ops), "GQA"


def kernels_checked(item) -> list:
    """The kernels a selected test of this module runs (built beforehand: tests/conftest.py)."""
    if item.originalname == "test_producer_forms_match_the_reference":
        op = EMULATED[item.callspec.params["name"]]
        return [TEMPLATE.emit(op, s, H100) for s in picked_forms(op)]
    if item.originalname == "test_a_broken_producer_pipeline_fails":
        return [mutated(item.callspec.params["edits"])]
    return []


@needs_emulator
@pytest.mark.usefixtures("module_kernels_built")
@pytest.mark.parametrize("name", list(EMULATED))
def test_producer_forms_match_the_reference(name):
    op = EMULATED[name]
    check_schedules(TEMPLATE, op, picked_forms(op), H100,
                    lambda o, arrays, s, arch: emulator.run_emulated(o, arrays, schedule=s, arch=arch))


# GQA (K/V's matrices are not Q's), causal, 520 keys: 64-key tiles in 3 stages, each refilled
BROKEN_OP = attention(1, 4, 2, 520, 128, BF16, causal=True)
BROKEN_SCHEDULE = WarpgroupAttentionSchedule(bm=128, bn=64, warps=8, stages=3, producer=True)
PV_RETIRED = "        wgmma_wait<0>();                                  // tile t - 1's P V has retired: O and P are free\n"
V_RELEASE = "        if (t > 0 && lane == 0) mbar_arrive(&empty_v[(t - 1) % STAGES]);   // V of tile t - 1 is free\n"
S_RETIRED = "        wgmma_wait<1>();                                  // S is in; P V may still run\n"
K_RELEASE = "        if (lane == 0) mbar_arrive(&empty_k[t % STAGES]);  // S_t has retired: K of tile t is free\n"
V_WAIT = "        if (t > 0) mbar_wait(&full_v[(t - 1) % STAGES], ((t - 1) / STAGES) & 1);   // and V of tile t - 1\n"


@needs_emulator
def test_consumers_taking_turns_wait_for_the_first_turn():
    op = EMULATED["attention S=256 D=64 bf16"]
    schedule = WarpgroupAttentionSchedule(128, 64, 8, 3, producer=True, pingpong=True)
    source = TEMPLATE.emit(op, schedule, H100)
    first = "    if (warpgroup == 1) named_barrier_arrive(1, 256);"
    assert first in source.source
    name = source.name + "_unstarted"
    broken = replace(source, name=name, source=source.source.replace(first, "").replace(source.name, name))
    inputs = random_inputs(op, rng_for(op))
    with pytest.raises(EmulatorError, match="deadlock"):
        build(broken)([*inputs.arrays, np.empty(op.result.shape, op.result.dtype.numpy)])


def mutated(edits):
    """The broken-pipeline kernel with `edits` ((old, new) pairs) made in turn."""
    source = TEMPLATE.emit(BROKEN_OP, BROKEN_SCHEDULE, H100)
    name = source.name + "_mutated_" + hashlib.sha256(repr(edits).encode()).hexdigest()[:8]
    text = source.source.replace(source.name, name)
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    return replace(source, name=name, source=text)


@needs_emulator
@pytest.mark.usefixtures("module_kernels_built")
@pytest.mark.parametrize("edits, message", [
    # V's stage handed back before the P V reading it retires: the producer refills it under the wgmma
    (((PV_RETIRED + V_RELEASE, V_RELEASE + PV_RETIRED),), "an issued wgmma still reads"),
    # ... or before that P V is even issued, which would read the refill
    (((V_RELEASE, ""), (V_WAIT, V_WAIT + V_RELEASE)), "still reads|yet to land"),
    # K's stage handed back before S = Q Kᵀ retires
    (((K_RELEASE, ""), (S_RETIRED, K_RELEASE + S_RETIRED)), "still reads|yet to land"),
    # the producer refills a stage without waiting for the consumers to hand it back
    ((("if (t >= STAGES) mbar_wait(&empty[st], (t / STAGES - 1) & 1);", ""),), "deadlock|still reads|yet to land"),
    # the producer expects half a tile's bytes: the phase completes with half the tile landed
    ((("mbar_arrive_expect_tx(&full[st], TILE_BYTES);", "mbar_arrive_expect_tx(&full[st], TILE_BYTES / 2);"),),
     "yet to land"),
    # one consumer warp fewer counted on a stage's hand-back
    ((("mbar_init(&empty_v[st], 4 * CONSUMERS);", "mbar_init(&empty_v[st], 4 * CONSUMERS - 1);"),),
     "deadlock|still reads|yet to land"),
    # the consumers read a key tile, a value tile or Q without waiting for it to land
    ((("        mbar_wait(&full_k[t % STAGES], (t / STAGES) & 1); // K of tile t has landed\n", ""),), "yet to land"),
    (((V_WAIT, ""),), "yet to land"),
    ((("    mbar_wait(q_full, 0);\n", ""),), "yet to land"),
    # the producer loads one tile more than the consumers wait for: in flight as the block ends
    ((("if (t + 1 < n_tiles) load(t + 1", "if (t + 1 <= n_tiles) load(t + 1"),), "in flight"),
    # K read from Q's head index: with GQA, another head's keys
    ((("k_mat = (int)(k_off / (SK * D))", "k_mat = (int)(q_off / (SK * D))"),), None),
])
def test_a_broken_producer_pipeline_fails(edits, message):
    """Each mutation (its edits of the source, in turn) stops the run with `message`, or (None)
    gives a wrong result."""
    kernel = mutated(edits)
    rng = rng_for(BROKEN_OP)
    inputs = random_inputs(BROKEN_OP, rng)
    out = np.full(BROKEN_OP.result.shape, np.nan, BROKEN_OP.result.dtype.numpy)
    if message:
        with pytest.raises(EmulatorError, match=message):
            build(kernel)([*inputs.arrays, out])
        return
    build(kernel)([*inputs.arrays, out])
    reference = expected(BROKEN_OP, inputs, rng).on(TEMPLATE.resources(BROKEN_OP, BROKEN_SCHEDULE, H100).unit)
    with pytest.raises(AssertionError):
        check(reference, out, "mutated kernel")


COMPILED = [
    (attention(2, 8, 8, 1024, 64, BF16), WarpgroupAttentionSchedule(128, 64, 8, 4, producer=True)),
    (attention(2, 8, 8, 1024, 128, BF16, causal=True), WarpgroupAttentionSchedule(128, 128, 8, 3, producer=True)),
    (attention(2, 8, 8, 1024, 128, BF16, causal=True),
     WarpgroupAttentionSchedule(128, 128, 8, 2, producer=True, pingpong=True)),
    (attention(2, 8, 8, 1024, 64, BF16), WarpgroupAttentionSchedule(128, 64, 8, 4, producer=True, pingpong=True)),
    (attention(2, 8, 2, 1024, 128, F16, mask=BOOL), WarpgroupAttentionSchedule(128, 64, 8, 4, producer=True)),
    (attention(1, 8, 8, 2048, 256, BF16, causal=True), WarpgroupAttentionSchedule(128, 32, 8, 5, producer=True)),
]


@pytest.mark.parametrize("op, schedule", COMPILED, ids=lambda x: getattr(x, "describe", lambda: None)())
def test_producer_forms_compile_for_sm_90a_without_spills_or_serialized_wgmmas(op, schedule):
    assert schedule in TEMPLATE.space(op, H100)
    source = TEMPLATE.emit(op, schedule, H100)
    compiled = compile_cuda(source, H100.sm)
    res = TEMPLATE.resources(op, schedule, H100)
    what = f"{op} at {schedule.describe()}"
    assert compiled.spill_bytes == 0, f"{what}: ptxas spills {compiled.spill_bytes} bytes"
    assert "Potential Performance Loss" not in compiled.log, compiled.log
    # the consumers' setmaxnreg.inc takes what the producer's .dec frees of the even share the block
    # launches with: launched with fewer, they would wait for registers forever
    assert compiled.registers == res.registers == registers_at_launch(source.threads), what
    assert "setmaxnreg" not in compiled.log, compiled.log          # ptxas ignoring it says so
    assert compiled.smem_bytes <= res.smem_bytes <= H100.smem_per_block
    assert source.threads == res.threads == 32 * schedule.warps + 128
    assert [m.operand for m in source.tensor_maps] == [0, 1, 2]


def test_the_space_holds_producer_forms_where_tensor_maps_load_whole_tiles():
    op = TEMPLATE.samples()[0]                                   # S=4096, D=64
    defaults = TEMPLATE.schedules(op, H100)
    assert not any(getattr(s, "producer", False) for s in defaults), "an untuned call runs as before"
    forms = producer_forms(op)
    assert {replace(s, producer=False, pingpong=False) for s in forms if s.stages >= 3} <= set(TEMPLATE.space(op, H100))
    assert TEMPLATE.variants(op, defaults[0], H100) == (replace(defaults[0], producer=True),
                                                        replace(defaults[0], producer=True, pingpong=True))
    assert TEMPLATE.variants(op, forms[0], H100) == ()
    assert not producer_forms(op, A100), "sm_80 has no TMA"
    short = attention(1, 2, 2, 100, 128, F16)                    # 100 query rows: a 128-row box overhangs
    assert TEMPLATE.schedules(short, H100) and not producer_forms(short)
    assert not TEMPLATE.valid(op, WarpgroupAttentionSchedule(192, 64, 12, 3, producer=True), H100), \
        "three consumers: setmaxnreg's split is for two"
    assert not TEMPLATE.valid(op, WarpgroupAttentionSchedule(64, 64, 4, 3, producer=True), H100), \
        "one consumer would leave its producer's registers idle"
    assert not TEMPLATE.valid(op, WarpgroupAttentionSchedule(128, 64, 8, 3, pingpong=True), H100)
    assert not TEMPLATE.valid(op, WarpgroupAttentionSchedule(128, 64, 8, 2), H100), "cp.async needs three stages"


def test_records_name_the_producer_form_and_older_records_the_cp_async_kernel():
    op = TEMPLATE.samples()[0]
    plain = TEMPLATE.schedules(op, H100)[0]
    form = replace(plain, producer=True)
    assert "producer" not in schedule_config(plain) and schedule_config(form)["producer"] is True
    space = TEMPLATE.space(op, H100)
    assert find_schedule(space, schedule_config(plain)) == plain
    assert find_schedule(space, schedule_config(form)) == form
    assert form.describe() == plain.describe() + " producer=True"
    assert TEMPLATE.emit(op, form, H100).name == TEMPLATE.emit(op, plain, H100).name + "_tma"
    turns = replace(form, pingpong=True)
    assert schedule_config(turns)["pingpong"] is True and find_schedule(space, schedule_config(turns)) == turns
    assert TEMPLATE.emit(op, turns, H100).name.endswith("_tma_pingpong")
