"""Tuning one kernel: methods, the cache (hits, estimates vs measurements, interpolation), the
search-space restriction, and what happens without a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import ArgumentError, TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.device import gpu_available
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.registry import templates_for
from tessera_rw.tune.cache import TuneCache
from tessera_rw.tune.cost import best_schedule
from tessera_rw.tune.kernel_tuner import Method, cached_schedule, signature_hash, tune_kernel
from tessera_rw.tune.measure import Measurement
from tessera_rw.tune.records import ChosenBy
from tessera_rw.tune.space import SpaceRestriction, find_schedule, knobs, ranked_space, schedule_config

H100 = arch_named("H100-SXM")


def matmul(m, n, k, dtype=DType.bfloat16, **attrs):
    a, b = TensorType((m, k), dtype), TensorType((k, n), dtype)
    return KernelOp.of("matmul", (a, b), TensorType((m, n), dtype), accum_dtype=None, **attrs)


class Fixed:
    """A measurer with a made-up 'GPU': the schedule with the smallest bm·bn·stages is fastest."""
    method = "on_device"

    def __init__(self):
        self.measured = []

    def measure(self, schedules):
        self.measured += schedules
        return [Measurement.of([float(s.bm * s.bn * s.stages) / 1000 + 1]) for s in schedules]


@pytest.fixture
def cache(tmp_path):
    return TuneCache("t", tmp_path)


def test_cost_model_method_picks_the_best_estimate_of_the_whole_space():
    op = matmul(2048, 2048, 2048)
    tuned = tune_kernel(op, H100, method="cost_model")
    space = ranked_space(templates_for(op)[0], op, H100)
    assert tuned.schedule == space.schedules[0] and tuned.time_us == space.estimates[0]
    assert tuned.default == best_schedule(templates_for(op)[0], op, H100)[0]
    assert len(tuned.trials) == len(space)       # estimates are cheap: every schedule is ranked


def test_second_run_hits_the_cache_and_measures_nothing(cache):
    op = matmul(1024, 512, 256)
    first = tune_kernel(op, H100, cache=cache, measurer=Fixed(), max_trials=12)
    assert first.chosen_by == "on_device" and first.record.chosen_by is ChosenBy.ON_DEVICE
    again = Fixed()
    second = tune_kernel(op, H100, cache=cache, measurer=again)
    assert second.chosen_by == "cache" and second.schedule == first.schedule and again.measured == []
    assert tune_kernel(op, H100, cache=cache, method="cost_model").chosen_by == "cache"   # a measurement answers


def test_a_cached_estimate_does_not_answer_a_measuring_tuner(cache):
    op = matmul(1024, 512, 256)
    tune_kernel(op, H100, cache=cache, method="cost_model")
    measurer = Fixed()
    tuned = tune_kernel(op, H100, cache=cache, measurer=measurer, max_trials=8)
    assert tuned.chosen_by == "on_device" and measurer.measured
    assert cache.get(op.op, signature_hash(op, templates_for(op)[0]), [(1024, 256), (256, 512)],
                     ["bf16", "bf16"], H100).chosen_by is ChosenBy.ON_DEVICE


def test_an_unseen_shape_starts_from_the_nearest_cached_shapes_schedule(cache):
    tuned = tune_kernel(matmul(1024, 1024, 1024), H100, cache=cache, measurer=Fixed(), max_trials=40)
    measurer = Fixed()
    tune_kernel(matmul(1024, 1024, 2048), H100, cache=cache, measurer=measurer, max_trials=4)
    assert measurer.measured[0] == tuned.schedule


def test_attributes_change_the_signature_hash():
    t = templates_for(matmul(64, 64, 64))[0]
    assert signature_hash(matmul(64, 64, 64), t) == signature_hash(matmul(128, 128, 64), t)   # shapes are separate
    assert signature_hash(matmul(64, 64, 64), t) != signature_hash(matmul(64, 64, 64, numerics="fast"), t)


def test_restriction_narrows_every_knob_the_template_has():
    op = matmul(2048, 2048, 2048)
    r = SpaceRestriction.of(tile_sizes=[(128, 128)], pipeline_stages=[2, 3])
    space = ranked_space(templates_for(op)[0], op, H100, r)
    assert space.schedules and all(knobs(s)["tile"][:2] == (128, 128) and s.stages in (2, 3) for s in space.schedules)
    softmax = KernelOp.of("softmax", (TensorType((64, 1024), DType.float32),), TensorType((64, 1024), DType.float32), axis=1)
    assert len(ranked_space(templates_for(softmax)[0], softmax, H100, r)) > 0     # no tile: left alone


def test_restriction_that_leaves_nothing_names_the_kernel_and_what_it_has():
    op = matmul(2048, 2048, 2048)
    with pytest.raises(ArgumentError, match="no schedule of the gemm kernel") as e:
        ranked_space(templates_for(op)[0], op, H100, SpaceRestriction.of(tile_sizes=[(48, 48)]))
    assert "tile" in e.value.hint


@pytest.mark.parametrize("bad", [dict(tile_sizes=[(64,)]), dict(pipeline_stages=[0]), dict(vectorize=[]),
                                 dict(warps=["4"])])
def test_bad_search_space_values_are_clear_errors(bad):
    with pytest.raises(ArgumentError, match="search_space"):
        SpaceRestriction.of(**bad)


@pytest.mark.parametrize("bad, says", [(dict(tile_sizes=[(64, 64), (7, 9)]), "tile edge 7"),
                                       (dict(tile_sizes=[(512, 64)]), "tile edge 512"),
                                       (dict(pipeline_stages=[2, 12]), "pipeline_stages 12"),
                                       (dict(vectorize=[3]), "vectorize 3"), (dict(warps=[64]), "warps 64")])
def test_a_value_no_kernel_can_have_is_refused_when_the_space_is_set(bad, says):
    k = op.kernel(lambda a, b: a @ b)
    with pytest.raises(ArgumentError, match=f"search_space: no kernel has {says}"):
        k.schedule.search_space(**bad)
    assert k.restriction is None                           # the kernel's space is as it was
    ok = SpaceRestriction.of(tile_sizes=[(192, 128, 8)], pipeline_stages=[8], vectorize=[16], warps=[32])
    assert ok.tile_sizes == ((192, 128, 8),)


@pytest.mark.skipif(gpu_available(), reason="checks the behaviour without a GPU")
def test_on_device_without_a_gpu_suggests_the_cost_model():
    with pytest.raises(TesseraError, match="has none") as e:
        tune_kernel(matmul(64, 64, 64), H100, method="on_device")
    assert "cost_model" in e.value.hint


@pytest.mark.skipif(gpu_available(), reason="checks the behaviour without a GPU")
def test_auto_without_a_gpu_uses_the_cost_model():
    assert Method.resolve("auto", "x") is Method.COST_MODEL
    assert tune_kernel(matmul(64, 64, 64), H100, method="auto").chosen_by == "cost_model"


def test_a_gpu_of_another_arch_does_not_time_for_it(monkeypatch):
    from tessera_rw.codegen import arch as arch_module
    from tessera_rw.tune import kernel_tuner
    monkeypatch.setattr(kernel_tuner, "gpu_available", lambda: True)
    monkeypatch.setattr(arch_module, "_device_identity", lambda: ("NVIDIA H100 80GB HBM3", (9, 0)))
    a100 = arch_named("A100-SXM")
    assert Method.resolve("auto", "x", H100) is Method.ON_DEVICE
    assert Method.resolve("auto", "x", a100) is Method.COST_MODEL
    with pytest.raises(TesseraError, match="time A100-SXM's kernels on this machine's NVIDIA H100") as e:
        Method.resolve("on_device", "x", a100)
    assert "cost_model" in e.value.hint


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ArgumentError, match="unknown method 'fastest'"):
        tune_kernel(matmul(64, 64, 64), H100, method="fastest")


def test_every_schedule_failing_is_an_error_with_the_reasons():
    class Broken:
        method = "on_device"

        def measure(self, schedules):
            return [Measurement.failed("launch failed") for _ in schedules]
    with pytest.raises(TesseraError, match="every schedule tried failed.*launch failed"):
        tune_kernel(matmul(256, 256, 256), H100, measurer=Broken(), max_trials=4)


def test_a_replayed_measurement_is_never_written_to_the_cache(cache):
    class Replay(Fixed):
        method = "replay"
    tune_kernel(matmul(256, 256, 256), H100, cache=cache, measurer=Replay(), max_trials=4)
    assert cache.records() == []


def test_a_restricted_search_never_answers_for_the_whole_space(cache):
    op, arch = matmul(1024, 1024, 1024), arch_named("H100-SXM")
    free = tune_kernel(op, arch, method="cost_model", cache=None)
    narrow = SpaceRestriction.of(tile_sizes=[(64, 64)], pipeline_stages=[2])
    restricted = tune_kernel(op, arch, method="cost_model", cache=cache, restriction=narrow)
    assert restricted.schedule != free.schedule and restricted.time_us > free.time_us
    later = tune_kernel(op, arch, method="cost_model", cache=cache)
    assert later.chosen_by == "cost_model" and later.schedule == free.schedule      # searched, not the cache
    again = tune_kernel(op, arch, method="cost_model", cache=cache, restriction=narrow)
    assert again.chosen_by == "cache" and again.schedule == restricted.schedule
    # the whole space's best answers a restricted call when the restriction admits it
    admitting = SpaceRestriction.of(pipeline_stages=[knobs(free.schedule)["pipeline_stages"]])
    assert tune_kernel(op, arch, method="cost_model", cache=cache, restriction=admitting).chosen_by == "cache"


def test_a_whole_space_record_outside_the_restriction_answers_no_restricted_lookup(cache):
    op = matmul(1024, 1024, 1024)
    free = tune_kernel(op, H100, method="cost_model", cache=cache)
    other_stages = next(n for n in (2, 3, 4, 5) if n != knobs(free.schedule)["pipeline_stages"])
    narrow = SpaceRestriction.of(pipeline_stages=[other_stages])
    assert cached_schedule(op, H100, cache, restriction=narrow) is None
    assert cached_schedule(op, H100, cache)[0] == free.schedule


def test_a_cached_schedule_the_space_no_longer_has_is_replaced_by_the_next_tuning(cache):
    """However fast it claimed to be: else every run would tune again and keep nothing."""
    op = matmul(512, 512, 512)
    tuned = tune_kernel(op, H100, method="cost_model", cache=cache)
    config = dict(tuned.record.config) | {"bm": 8}                # a tile no schedule of the space has
    cache.put(tuned.record.model_copy(update={"config": config, "time_us": 0.001}), supersede=True)
    assert cached_schedule(op, H100, cache) is None
    again = tune_kernel(op, H100, method="cost_model", cache=cache)
    assert again.chosen_by == "cost_model" and again.schedule == tuned.schedule
    assert tune_kernel(op, H100, method="cost_model", cache=cache).chosen_by == "cache"


def test_every_measurer_has_the_protocols_members():
    """The device measurer runs only on a GPU: its shape is checked here, where CI runs."""
    import inspect
    from tessera_rw.tune.device_measure import DeviceMeasurer
    from tessera_rw.tune.measure import CostModelMeasurer, Measurer
    from tessera_rw.tune.timing_log import ReplayMeasurer
    wanted = {n for n, _ in inspect.getmembers(Measurer, inspect.isfunction) if not n.startswith("_")}
    for cls in (DeviceMeasurer, CostModelMeasurer, ReplayMeasurer):
        assert all(callable(getattr(cls, name, None)) for name in wanted), cls
        assert inspect.signature(cls.measure).parameters.keys() == inspect.signature(Measurer.measure).parameters.keys()


class WalkFaster:
    """A made-up GPU where the default tile walking `group` tile rows is fastest, beyond noise."""
    method = "on_device"

    def __init__(self, default, group):
        self.fast = replace(default, group=group)

    def measure(self, schedules):
        return [Measurement.of([90.0 if s == self.fast else 100.0 + (s != replace(s, group=0))]) for s in schedules]


def test_a_walk_the_tuner_times_faster_than_the_models_is_kept_and_found_again(cache):
    op = matmul(4096, 4096, 4096)
    template = templates_for(op)[0]
    space = ranked_space(template, op, H100)
    walks = [s for s in space.schedules if s.group and replace(s, group=0) == space.default]
    assert walks, "4096³ bf16 operands outrun half the L2: the default's other walks are in the space"
    measurer = WalkFaster(space.default, walks[-1].group)
    tuned = tune_kernel(op, H100, cache=cache, measurer=measurer, max_trials=len(space))
    assert tuned.schedule == walks[-1] and tuned.default == space.default
    assert tuned.record.config["group"] == walks[-1].group
    again = tune_kernel(op, H100, cache=cache, measurer=Fixed())
    assert again.chosen_by == "cache" and again.schedule == walks[-1]


class OneFaster:
    """A made-up GPU where one schedule runs 10% faster than all others."""
    method = "on_device"

    def __init__(self, fast):
        self.fast = fast

    def measure(self, schedules):
        return [Measurement.of([90.0 if s == self.fast else 100.0]) for s in schedules]


def test_an_attention_producer_form_the_tuner_times_faster_is_kept_and_found_again(cache):
    q = TensorType((4, 16, 2048, 64), DType.bfloat16)
    attention = KernelOp.of("flash_attention", (q, q, q), q, scale=None, causal=False, has_mask=False)
    template = templates_for(attention)[0]
    space = ranked_space(template, attention, H100)
    forms = template.variants(attention, space.default, H100)
    assert [(s.producer, s.pingpong) for s in forms] == [(True, False), (True, True)]
    tuned = tune_kernel(attention, H100, cache=cache, measurer=OneFaster(forms[-1]))
    assert tuned.schedule == forms[-1] and tuned.default == space.default
    assert tuned.record.config["producer"] is True and tuned.record.config["pingpong"] is True
    again = tune_kernel(attention, H100, cache=cache, measurer=Fixed())
    assert again.chosen_by == "cache" and again.schedule == forms[-1]


def test_the_best_estimates_variants_are_timed_in_the_first_trials():
    op = matmul(4096, 4096, 4096)
    template = templates_for(op)[0]
    space = ranked_space(template, op, H100)
    forms = template.variants(op, space.schedules[0], H100)
    persistent = [s for s in forms if getattr(s, "persistent", False)]
    assert persistent and len(forms) > 4
    measurer = WalkFaster(space.default, 0)
    measurer.fast = persistent[-1]          # the last variant listed: past the cost model's four seeds
    tuned = tune_kernel(op, H100, measurer=measurer, max_trials=4 + len(forms))
    assert tuned.schedule == persistent[-1]
    assert {t.schedule for t in tuned.trials} >= set(forms)


def test_a_config_leaves_out_the_models_walk_so_older_records_name_the_same_schedule():
    op = matmul(4096, 4096, 4096)
    space = ranked_space(templates_for(op)[0], op, H100)
    config = schedule_config(space.default)
    assert "group" not in config and config["kind"] == "tma"
    assert find_schedule(space.schedules, config) == space.default
    walked = replace(space.default, group=1)
    assert schedule_config(walked) == config | {"group": 1}
    assert find_schedule(space.schedules, schedule_config(walked)) == walked


def test_a_nearer_shapes_persistent_winner_seeds_a_shape_without_that_form_with_its_tile(cache):
    big, small = matmul(4096, 4096, 4096), matmul(1024, 1024, 1024)     # 512 tiles, and 32 (fewer than SMs)
    template = templates_for(big)[0]
    space = ranked_space(template, big, H100)
    persistent = [s for s in template.variants(big, space.schedules[0], H100) if getattr(s, "persistent", False)]
    measurer = WalkFaster(space.default, 0)
    measurer.fast = persistent[-1]                     # persistent and walking another order
    assert tune_kernel(big, H100, cache=cache, measurer=measurer, max_trials=40).schedule == persistent[-1]
    hit = cached_schedule(small, H100, cache)
    assert hit is not None, "the tile of the nearest shape's winner, as a plain launch, in the model's walk"
    schedule, record = hit
    assert record.interpolated and schedule == replace(persistent[-1], persistent=False, group=0)


def test_configs_written_with_every_field_still_name_their_schedules():
    from tessera_rw.codegen.templates.reduction import ReductionSchedule
    from tessera_rw.tune.space import full_config
    plain = ReductionSchedule(256, 4, 32)
    old = {"threads": 256, "vec": 4, "split": 32, "blocks": 1}          # as records spelled it before
    assert full_config(plain) == old and schedule_config(plain) == {"threads": 256, "vec": 4, "split": 32}
    assert find_schedule([ReductionSchedule(128, 4, 32), plain], old) == plain
    assert find_schedule([plain], old | {"blocks": 4}) is None
    assert find_schedule([plain], old | {"blocks": 4}, loose=True) == plain
