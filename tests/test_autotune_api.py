"""The public tuning API: autotune(...), autotune.enable/load/save_cache/load_cache, @op.autotune
and kernel.schedule, on the cost model (these run on any machine)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from tessera_rw import autotune, op
from tessera_rw.algebra.errors import ArgumentError, ShapeError, TesseraError
from tessera_rw.codegen.device import gpu_available
from tessera_rw.tune.cache import TuneCache, TuneCacheError, TuneCacheWarning
from tessera_rw.tune.progress import TuningProgress
from tessera_rw.tune.search import Trial
from tessera_rw.tune.measure import Measurement


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    yield tmp_path
    autotune.enable(False, cache="default")


def test_autotune_an_op_prints_a_config_and_caches_it():
    assert autotune.load(op.matmul, (1024, 1024, 1024), dtype="bf16") is None
    cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model")
    assert str(cfg).startswith("Best config: tile=(") and "pipeline_depth=" in str(cfg) and "fusion=" in str(cfg)
    assert cfg.chosen_by == "cost_model" and cfg.main.kind == "gemm"
    loaded = autotune.load(op.matmul, (1024, 1024, 1024), dtype="bf16")
    assert loaded is not None and loaded.knobs() == cfg.knobs() and loaded.chosen_by == "cache"
    again = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model")
    assert again.chosen_by == "cache" and again.knobs() == cfg.knobs()


def test_load_interpolates_an_unseen_shape_from_the_nearest_cached_one():
    autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model")
    near = autotune.load(op.matmul, (1024, 1024, 2048), dtype="bf16")
    assert near is not None and near.main.chosen_by == "interpolated" and near.main.record.interpolated
    assert near.chosen_by == "interpolated" and repr(near).count("interpolated") == 1 and "interpolated" in str(near)
    from tessera_rw.explain_report import explain_report
    assert explain_report(near.program).program.chosen_by == "cache"     # the report's schema holds
    assert autotune.load(op.matmul, (1024, 1024, 1024), dtype="bf16").chosen_by == "cache"


def test_shapes_one_per_operand_and_mismatches():
    cfg = autotune(op.add, shapes=((256, 256), (256, 256)), dtype="float32", method="cost_model", cache=None)
    assert cfg.main.kind == "elementwise"
    with pytest.raises(ArgumentError, match="3 shapes for 2 operands"):
        autotune(op.add, shapes=((4,), (4,), (4,)), method="cost_model")
    numpy_dims = tuple(np.int64(n) for n in (64, 64, 64))
    assert autotune(op.matmul, shapes=numpy_dims, dtype="bf16", method="cost_model", cache=None).main.kind == "gemm"
    for bad, says in (((64.0, 64, 64), "the dimension 64.0 .* is not an integer"), ("64,64,64", "is not a shape"),
                      (5, "is not a shape")):
        with pytest.raises(ArgumentError, match=says):
            autotune(op.matmul, shapes=bad, dtype="bf16", method="cost_model", cache=None)
    with pytest.raises(TesseraError, match="autotune cache name 5 is not a plain file name"):
        autotune(op.matmul, shapes=(64, 64, 64), method="cost_model", cache=5)


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("On", True), ("0", False), ("", False),
                                       ("no", False), ("maybe", None)])
def test_the_environment_switch_says_on_or_off_or_that_it_is_neither(value, on, monkeypatch):
    from tessera_rw import tuning_switch
    monkeypatch.setenv("TESSERA_AUTOTUNE", value)
    monkeypatch.setattr(tuning_switch, "_PROCESS", [])          # a new process reads the environment
    if on is None:
        with pytest.raises(ArgumentError, match="TESSERA_AUTOTUNE='maybe' is neither on nor off"):
            autotune.enabled
    else:
        assert autotune.enabled is on


def test_save_and_load_cache_move_records_between_caches(tmp_path):
    autotune(op.matmul, shapes=(512, 512, 512), dtype="bf16", method="cost_model")
    path = tmp_path / "h100.json"
    saved = autotune.save_cache(path)
    assert saved >= 2            # the program's choice and its kernel's schedule
    assert autotune.load_cache(path, cache="other") == saved
    assert autotune.load(op.matmul, (512, 512, 512), dtype="bf16", cache="other") is not None


def test_saving_an_empty_cache_while_another_holds_records_names_it(tmp_path):
    autotune(op.matmul, shapes=(256, 256, 256), dtype="bf16", method="cost_model", cache="h100_configs")
    with pytest.warns(TuneCacheWarning, match="'h100_configs' hold some: save_cache\\(path, cache='h100_configs'\\)"):
        assert autotune.save_cache(tmp_path / "empty.json") == 0
    assert autotune.save_cache(tmp_path / "full.json", cache="h100_configs") >= 2


def test_op_autotune_decorator_tunes_once_then_a_new_process_hits_the_cache():
    def body(a, b):
        return op.relu(op.matmul(a, b))
    first = op.autotune(cache="mine", method="cost_model")(op.kernel(body))
    a = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    np.testing.assert_allclose(first(a, b), np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    assert first.program(a, b).chosen_by == "cost_model"
    assert TuneCache("mine").records()
    fresh = op.autotune(cache="mine", method="cost_model")(op.kernel(body))   # as a new process would
    assert fresh.program(a, b).chosen_by == "cache"


def test_autotune_enable_makes_every_kernel_tune():
    @op.kernel
    def f(x):
        return op.softmax(x * 2.0, axis=-1)
    x = np.ones((8, 128), np.float32)
    assert f.program(x).tuning is None
    autotune.enable(True, cache="global")
    program = f.program(x)
    assert program.tuning is not None and TuneCache("global").records()
    autotune.enable(False)
    assert f.program(x).tuning is None


def test_a_scoped_autotune_holds_in_its_block_and_thread_only():
    import threading

    @op.kernel
    def f(x):
        return op.softmax(x * 3.0, axis=-1)
    x = np.ones((8, 64), np.float32)
    seen = {}
    with autotune.scoped(cache="scoped"):
        assert f.program(x).tuning is not None and TuneCache("scoped").records()
        worker = threading.Thread(target=lambda: seen.update(on=autotune.enabled))
        worker.start()
        worker.join()
        with autotune.scoped(False):
            assert f.program(x).tuning is None
        assert autotune.cache == "scoped"
    assert seen == {"on": False} and not autotune.enabled and autotune.cache == "default"
    with pytest.raises(RuntimeError), autotune.scoped():
        raise RuntimeError("the scope ends with the block")
    assert not autotune.enabled


def test_explain_measures_nothing_where_a_call_would_tune_on_the_gpu(monkeypatch):
    from tessera_rw.tune import kernel_tuner

    def no_device(*args, **kwargs):
        raise AssertionError("explain measured on the device")
    monkeypatch.setattr(kernel_tuner, "gpu_available", lambda: True)        # 'auto' resolves to on_device
    monkeypatch.setattr(kernel_tuner, "is_this_gpu", lambda arch: True)
    monkeypatch.setattr(kernel_tuner, "tune_kernel", no_device)

    @op.autotune(method="auto", cache="explained")
    @op.kernel
    def f(x, w):
        return op.gelu(x @ w)
    spec = op.tensor((256, 256), "bf16")
    report = f.explain(spec, spec)
    assert report.chosen_by == "cost_model" and not TuneCache("explained").records()
    assert not f._programs                      # a call still compiles, and tunes, its own program
    autotune(f, shapes=[(256, 256)] * 2, dtype="bf16", method="cost_model", cache="explained")
    records = TuneCache("explained").records()
    assert records and f.explain(spec, spec).chosen_by == "cache"    # what the cache holds, read only
    assert TuneCache("explained").records() == records


def test_schedule_search_space_and_autotune_on_a_kernel():
    @op.kernel
    def mm(a, b):
        return op.matmul(a, b)
    with pytest.raises(ArgumentError, match="has not been called or traced"):
        mm.schedule.autotune(method="cost_model")
    assert mm.tuning is None                    # a failed call turns no tuning on
    if not gpu_available():                     # on_device fails without a GPU, once the kernel is traced
        with pytest.raises(TesseraError, match="has none"):
            mm.schedule.autotune(op.tensor((64, 64), "bf16"), op.tensor((64, 64), "bf16"), method="on_device")
        assert mm.tuning is None and mm.program(op.tensor((64, 64), "bf16"), op.tensor((64, 64), "bf16")).tuning is None
    mm.schedule.search_space(tile_sizes=[(64, 64)], pipeline_stages=[2, 3])
    cfg = mm.schedule.autotune(op.tensor((1024, 1024), "bf16"), op.tensor((1024, 1024), "bf16"),
                               method="cost_model", max_trials=10)
    assert cfg.knobs()["tile"][:2] == (64, 64) and cfg.knobs()["pipeline_depth"] in (2, 3)
    with pytest.raises(ArgumentError, match="unknown cost model"):
        mm.schedule.autotune(cost_model="oracle")


def test_a_configs_table_prints_as_text():
    cfg = autotune(op.matmul, shapes=(256, 256, 256), dtype="bf16", method="cost_model", cache=None)
    text = str(cfg.table())
    assert "matmul" in text and "% of best" in text and "◀" in text


def test_schedule_autotune_keeps_to_the_kernels_own_cache():
    @op.autotune(cache="own_records", method="cost_model")
    def mm(a, b):
        return op.matmul(a, b)
    spec = op.tensor((256, 256), "bf16")
    mm.schedule.autotune(spec, spec, method="cost_model", max_trials=4)
    assert TuneCache("own_records").records() and not TuneCache("default").records()
    assert mm.tuning.cache == "own_records"


def test_op_autotune_rejects_a_bad_cache_name_and_method():
    with pytest.raises(TuneCacheError, match="not a plain file name"):
        op.autotune(cache="../etc")
    with pytest.raises(ArgumentError, match="unknown method") as e:
        op.autotune(method="roofline")
    assert "'cost_model' (rank by the roofline model)" in e.value.hint


def test_progress_shows_after_a_second_on_a_terminal_then_a_closing_table():
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.kernel_op import KernelOp
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    ticks = iter([0.0, 0.5, 1.5, 2.0, 2.5])
    progress = TuningProgress("attention", console, clock=lambda: next(ticks))
    t = TensorType((8, 8), DType.float32)
    kop = KernelOp.of("exp", (t,), t)
    progress.on_trial(kop, Trial(0, "fast", 1.0, Measurement(10.0, 0.1, (10.0,))))
    assert not progress.shown                       # half a second in: nothing yet
    progress.on_trial(kop, Trial(1, "slow", 2.0, Measurement(15.0, 0.1, (15.0,))))
    assert progress.shown
    progress.close({kop: "fast"})
    text = out.getvalue()
    assert "150%" in text and "100%" in text and "◀" in text


def test_progress_stays_silent_off_a_terminal():
    out = io.StringIO()
    ticks = iter([0.0, 5.0, 6.0])
    progress = TuningProgress("x", Console(file=out, force_terminal=False), clock=lambda: next(ticks))
    progress.on_trial(object(), Trial(0, "a", 1.0, Measurement(1.0)))
    progress.close()
    assert not progress.shown and out.getvalue() == ""


def test_the_time_budget_is_the_whole_plans(monkeypatch):
    # each kernel searches in what the ones before it left (before, each kernel had the whole budget)
    import time

    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.lower.lowering import lower
    from tessera_rw.tune import plan_tuner
    budgets, tune_kernel = [], plan_tuner.tune_kernel

    def slow_tune_kernel(op, arch, *, time_budget_s, **settings):
        budgets.append(time_budget_s)
        time.sleep(0.1)
        return tune_kernel(op, arch, time_budget_s=time_budget_s, **settings)

    monkeypatch.setattr(plan_tuner, "tune_kernel", slow_tune_kernel)
    k = op.kernel(lambda x, w1, w2: op.relu(op.exp(x) @ w1) @ w2)
    plan = lower(k.trace(op.tensor((64, 32), "float32"), op.tensor((32, 48), "float32"),
                         op.tensor((48, 16), "float32")))
    settings = plan_tuner.TuneSettings(method="cost_model", cache=None, time_budget_s=0.15)
    plan_tuner.tune_plan(plan, arch_named("H100-SXM"), settings)
    assert len(budgets) >= 3, plan
    assert budgets[0] <= 0.15 and budgets[1] <= budgets[0] - 0.09 and budgets[2] <= 1e-6   # 2 x 0.1 s > 0.15 s


def test_a_programs_cached_choice_is_keyed_by_its_policy_and_its_candidates():
    # the record names a candidate by index: another policy, or other rules, mean other candidates
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.numerics import Numerics
    from tessera_rw.rules.library import BUILTIN_RULESETS
    from tessera_rw.rules.saturate import rewrite
    from tessera_rw.tune.candidate_choice import program_key
    from tessera_rw.tune.extract import extract_candidates
    graph = op.kernel(lambda x, w: op.gelu(x @ w)).trace(op.tensor((64, 32), "bf16"), op.tensor((32, 16), "bf16"))
    candidates = extract_candidates(rewrite(graph, BUILTIN_RULESETS), arch_named("H100-SXM"))
    assert len(candidates) >= 2
    key = program_key(graph, candidates, Numerics.DETERMINISTIC)
    assert key == program_key(graph, candidates, Numerics.DETERMINISTIC)
    assert key != program_key(graph, candidates, Numerics.FAST)
    assert key != program_key(graph, candidates[:1], Numerics.DETERMINISTIC)
    from tessera_rw.tune.space import SpaceRestriction
    assert key == program_key(graph, candidates, Numerics.DETERMINISTIC, SpaceRestriction())
    assert key != program_key(graph, candidates, Numerics.DETERMINISTIC, SpaceRestriction.of(tile_sizes=[(128, 128)]))


def test_matmul_shapes_are_m_n_k_one_per_operand_or_one_both_share():
    shared = autotune(op.matmul, shapes=(512, 512), dtype="bf16", method="cost_model", cache=None)
    cube = autotune(op.matmul, shapes=(512, 512, 512), dtype="bf16", method="cost_model", cache=None)
    assert repr(shared) == repr(cube) and "matmul(bf16[512,512], bf16[512,512])" in repr(shared)
    with pytest.raises(ShapeError, match=r"matmul(.|\n)*contracts 5 with 7"):
        autotune(op.matmul, shapes=(7, 5), dtype="bf16", method="cost_model", cache=None)


def test_tuning_and_loading_use_the_kernels_own_cache_else_enables():
    autotune.enable(True, cache="h100_configs")
    autotune(op.matmul, shapes=(256, 256, 256), dtype="bf16", method="cost_model")
    assert TuneCache("h100_configs").records() and not TuneCache("default").records()
    assert autotune.load(op.matmul, (256, 256, 256), dtype="bf16") is not None
    autotune.enable(False, cache="default")

    @op.autotune(cache="own_records", method="cost_model")
    def mm(a, b):
        return op.matmul(a, b)
    autotune(mm, shapes=((128, 64), (64, 32)), dtype="bf16", method="cost_model")
    assert TuneCache("own_records").records() and not TuneCache("default").records()
    assert autotune.load(mm, ((128, 64), (64, 32)), dtype="bf16") is not None


def test_tuning_what_has_no_kernel_to_tune_says_why():
    from tessera_rw.tune.kernel_tuner import TuneError
    with pytest.raises(TuneError, match=r"matmul of float64: the gemm kernel multiplies f32, bf16, fp16 or fp8"):
        autotune(op.matmul, shapes=(64, 64, 64), dtype="float64", method="cost_model", arch="H100-SXM")
    with pytest.raises(TuneError, match=r"computes no empty product \(M=256, N=0, K=256\)") as empty:
        autotune(op.matmul, shapes=(256, 0, 256), dtype="bf16", method="cost_model", arch="H100-SXM")
    assert "float32, bf16 or fp16 form" not in str(empty.value)
    with pytest.raises(TuneError, match=r"has no kernel A100-SXM can run"):
        autotune(op.matmul, shapes=(64, 64, 64), dtype="float8_e4m3fn", method="cost_model", arch="A100-SXM")
    assert not TuneCache("default").records()


def test_an_op_with_optional_tensor_operands_tunes_with_them():
    cfg = autotune(op.layernorm, shapes=((1024, 1024), (1024,), (1024,)), dtype="bf16", method="cost_model")
    assert cfg.main.kind == "layernorm" and len(cfg.program.graph.inputs) == 3
    with pytest.raises(ArgumentError, match=r"4 shapes for 3 operands \(x, weight, bias\)"):
        autotune(op.layernorm, shapes=((8, 8), (8,), (8,), (3,)), dtype="bf16", method="cost_model")
    with pytest.raises(ArgumentError, match=r"3 shapes for 2 operands \(a, b\)"):        # accum_dtype is no operand
        autotune(op.matmul, shapes=((64, 64), (64, 64), (64,)), dtype="bf16", method="cost_model")
    masked = autotune(op.flash_attention, shapes=((1, 2, 128, 64),) * 3 + ((128, 128),),
                      dtype=["bf16"] * 3 + ["bool"], method="cost_model")        # the mask follows `scale`
    assert len(masked.program.graph.inputs) == 4


def test_a_cached_fusion_depth_with_kernels_tuned_anew_says_how_they_were_tuned():
    @op.autotune(cache="mixed", method="cost_model")
    def mm(a, b):
        return op.matmul(a, b)
    spec = op.tensor((512, 512), "bf16")
    first = mm.schedule.autotune(spec, spec, method="cost_model")
    assert first.chosen_by == "cost_model"
    assert mm.schedule.autotune(spec, spec, method="cost_model").chosen_by == "cache"
    mm.schedule.search_space(tile_sizes=[(128, 128)])                # a new space: its kernels tune again
    narrowed = mm.schedule.autotune(spec, spec, method="cost_model")
    assert narrowed.chosen_by == "cost_model" and narrowed.main.schedule.bm == 128


@pytest.mark.parametrize("on", ["false", "no", None, 2])
def test_switching_tuning_takes_a_bool_not_a_truthy_string(on):
    with pytest.raises(ArgumentError, match=r"`on` must be True or False"):
        autotune.enable(on)
    with pytest.raises(ArgumentError, match=r"autotune.scoped\(on="):
        with autotune.scoped(on):
            pass
    assert not autotune.enabled


def test_loading_from_a_misspelt_cache_is_an_error_not_none():
    autotune(op.matmul, shapes=(128, 128, 128), dtype="bf16", method="cost_model", cache="spelt_right")
    assert autotune.load(op.matmul, (128, 128, 128), dtype="bf16", cache="spelt_right") is not None
    with pytest.raises(ArgumentError, match=r"no autotune cache named 'spelt_rihgt'.*\n.*spelt_right"):
        autotune.load(op.matmul, (128, 128, 128), dtype="bf16", cache="spelt_rihgt")
    with pytest.raises(ArgumentError, match=r"cache=None\): a load reads a cache"):
        autotune.load(op.matmul, (128, 128, 128), dtype="bf16", cache=None)
    assert autotune.load(op.matmul, (128, 128, 128), dtype="bf16", cache="default") is None   # not made yet


def test_loading_a_config_does_not_add_a_signature_to_the_kernel():
    @op.kernel
    def mm(a, b):
        return op.matmul(a, b)

    mm(np.ones((4, 8), np.float32), np.ones((8, 2), np.float32))
    before = repr(mm)
    autotune.load(mm, ((100, 64), (64, 32)))
    assert repr(mm) == before


def test_estimates_are_shown_without_a_noise_band():
    cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model", cache=None)
    text = str(cfg.table())
    assert " µs " in text and "±" not in text


def test_search_space_may_be_given_as_a_dict_of_its_keywords():
    cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model", cache=None,
                   search_space={"tile_sizes": [(64, 64)], "pipeline_stages": [3]})
    assert cfg.knobs()["tile"][:2] == (64, 64) and cfg.knobs()["pipeline_depth"] == 3
    for odd, says in (({"tiles": [(64, 64)]}, r"got the keys \['tiles'\]"), ([(64, 64)], r"got \[\(64, 64\)\]")):
        with pytest.raises(ArgumentError, match=r"search_space takes a dict of tile_sizes, pipeline_stages.*" + says):
            autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model", cache=None,
                     search_space=odd)


@pytest.mark.parametrize("call, says", [
    (lambda: autotune(np.matmul, shapes=(8, 8, 8)), r"<ufunc 'matmul'> is not an op or a kernel\n.*op\.matmul"),
    (lambda: autotune(op.matmul, shapes=(8, -1, 8)), r"autotune matmul: .* negative dimension -1"),
    (lambda: autotune(op.add, shapes=((8, -2), (8, 1))), r"autotune add: .* negative dimension -2"),
    (lambda: autotune.save_cache(None), r"autotune.save_cache: the file must be a path .* got None"),
    (lambda: autotune.load_cache(3), r"autotune.load_cache: the file must be a path .* got 3"),
])
def test_bad_tuning_arguments_name_what_is_wrong(call, says):
    with pytest.raises(ArgumentError, match=says):
        call()
