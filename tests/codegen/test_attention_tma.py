"""The producer form of sm_90's wgmma FlashAttention kernel (attention_tma_cuda.py): a producer
warpgroup loading Q, K and V with TMA copies, handed over by mbarriers. Under the CPU emulator it
matches float64 numpy (one and two consumer warpgroups, head dims 64, 128 and 256, causal, masks,
GQA, ragged key tiles, the logsumexp output), and the ways its pipeline goes wrong fail; NVRTC and
ptxas build it for sm_90a without spills or serialized wgmmas; the tuning space holds it beside the
cp.async kernel where tensor maps can load the operands, and records name both forms."""

from __future__ import annotations

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
from tessera_rw.tune.space import find_schedule, schedule_config
from tests.codegen.emulated_attention_ops import ATTENTION_OPS, BF16, BOOL, F16, attention
from tests.codegen.schedule_check import check_schedules, rng_for
from tests.codegen.test_template_contract import REGISTER_BOUND

H100, A100 = arch_named("h100"), arch_named("a100")
TEMPLATE = FlashAttentionTemplate()
needs_emulator = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


def producer_forms(op, arch=H100) -> list[WarpgroupAttentionSchedule]:
    return [s for s in TEMPLATE.space(op, arch) if getattr(s, "producer", False)]


def picked_forms(op) -> list[WarpgroupAttentionSchedule]:
    """The first and last producer forms of the op's space, and its first of one consumer, of two
    taking turns, and of two stages, where it has them."""
    forms = producer_forms(op)
    one = [s for s in forms if s.consumers == 1]
    pingpong = [s for s in forms if s.pingpong]
    two = [s for s in forms if s.stages == 2]
    return list(dict.fromkeys(forms[:1] + forms[-1:] + one[:1] + pingpong[:1] + two[:1]))


EMULATED = {name: op for name, op in ATTENTION_OPS.items() if TEMPLATE.accepts(op) and producer_forms(op)}


def test_the_emulated_ops_cover_what_the_producer_kernel_takes():
    forms = [s for op in EMULATED.values() for s in picked_forms(op)]
    assert {s.consumers for s in forms} == {1, 2} and {s.pingpong for s in forms} == {False, True}
    assert 2 in {s.stages for s in forms}
    assert {op.operands[0].shape[-1] for op in EMULATED.values()} == {64, 128, 256}
    ops = EMULATED.values()
    assert any(o.attr_map.get("causal") for o in ops) and any(o.attr_map.get("has_mask") for o in ops)
    assert any(o.op == "flash_attention_lse" for o in ops)
    assert any(o.operands[0].shape[1] != o.operands[1].shape[1] for o in ops), "GQA"


@needs_emulator
@pytest.mark.parametrize("name", list(EMULATED))
def test_producer_forms_match_the_reference(name):
    op = EMULATED[name]
    check_schedules(TEMPLATE, op, picked_forms(op), H100,
                    lambda o, arrays, s, arch: emulator.run_emulated(o, arrays, schedule=s, arch=arch))


# GQA (K/V's matrices are not Q's), causal, 520 keys: 64-key tiles in 3 stages, each refilled
BROKEN_OP = attention(1, 4, 2, 520, 128, BF16, causal=True)
BROKEN_SCHEDULE = WarpgroupAttentionSchedule(bm=128, bn=64, warps=8, stages=3, producer=True)
PV_RETIRED = "        wgmma_wait<0>();                                  // tile t - 1's P V has retired: O and P are free\n"
RELEASE = "        if (t > 0 && lane == 0) mbar_arrive(&empty[(t - 1) % STAGES]);   // tile t - 1's stage is free\n"


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


@needs_emulator
@pytest.mark.parametrize("old, new, message", [
    # a stage handed back before the P V reading its V retires: the producer refills it under the wgmma
    (PV_RETIRED + RELEASE, RELEASE + PV_RETIRED, "an issued wgmma still reads"),
    # the producer refills a stage without waiting for the consumers to hand it back
    ("if (t >= STAGES) mbar_wait(&empty[st], (t / STAGES - 1) & 1);", "", "deadlock|still reads"),
    # the producer expects half a stage's bytes: the phase never completes
    ("mbar_arrive_expect_tx(&full[st], STAGE_BYTES);", "mbar_arrive_expect_tx(&full[st], STAGE_BYTES / 2);", "deadlock"),
    # one consumer warp fewer counted on a stage's hand-back
    ("mbar_init(&empty[st], 4 * CONSUMERS);", "mbar_init(&empty[st], 4 * CONSUMERS - 1);", "deadlock|still reads"),
    # the consumers read a key tile, or Q, without waiting for it to land: stale shared memory
    ("        mbar_wait(&full[t % STAGES], (t / STAGES) & 1);   // tile t has landed\n", "", None),
    ("    mbar_wait(q_full, 0);\n", "", None),
    # K read from Q's head index: with GQA, another head's keys
    ("k_mat = (int)(k_off / (SK * D))", "k_mat = (int)(q_off / (SK * D))", None),
])
def test_a_broken_producer_pipeline_fails(old, new, message):
    """Each mutation stops the run with `message`, or (None) gives a wrong result."""
    source = TEMPLATE.emit(BROKEN_OP, BROKEN_SCHEDULE, H100)
    assert old in source.source
    name = source.name + "_mutated"
    mutated = replace(source, name=name, source=source.source.replace(old, new).replace(source.name, name))
    rng = rng_for(BROKEN_OP)
    inputs = random_inputs(BROKEN_OP, rng)
    out = np.full(BROKEN_OP.result.shape, np.nan, BROKEN_OP.result.dtype.numpy)
    if message:
        with pytest.raises(EmulatorError, match=message):
            build(mutated)([*inputs.arrays, out])
        return
    build(mutated)([*inputs.arrays, out])
    reference = expected(BROKEN_OP, inputs, rng).on(TEMPLATE.resources(BROKEN_OP, BROKEN_SCHEDULE, H100).unit)
    with pytest.raises(AssertionError):
        check(reference, out, "mutated kernel")


COMPILED = [
    (attention(2, 8, 8, 1024, 64, BF16), WarpgroupAttentionSchedule(128, 64, 8, 4, producer=True)),
    (attention(2, 8, 8, 1024, 64, BF16), WarpgroupAttentionSchedule(64, 64, 4, 4, producer=True)),
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
    error = (res.registers - compiled.registers) / compiled.registers
    assert abs(error) <= REGISTER_BOUND, f"{what}: estimate {res.registers}, ptxas {compiled.registers}"
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
    assert not TEMPLATE.valid(op, WarpgroupAttentionSchedule(64, 64, 4, 3, producer=True, pingpong=True), H100), \
        "one consumer has no one to take turns with"
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
