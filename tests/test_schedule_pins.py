"""Schedule pins: `op.matmul(a, b, tile_shape=...)` fixes the tile of the GEMM kernel computing that
product (in a kernel and eagerly), skips tuning it, and says clearly when the tile cannot run or
when no kernel of the chosen plan computes the product."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import autotune, op
from tessera_rw.algebra.errors import ArgumentError, AttributeValueError
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.kernel_sources import generated_kernels
from tessera_rw.pipeline import compile_program
from tessera_rw.tune.pins import PinWarning
from tessera_rw.tune.plan_tuner import TuneSettings
from tessera_rw.tune.records import ChosenBy

H100 = arch_named("H100-SXM")
A100 = arch_named("A100-SXM")
BF16 = "bf16"


def tile_of(schedule) -> tuple[int, int, int]:
    return schedule.bm, schedule.bn, schedule.bk


def pinned_linear(tile):
    @op.kernel
    def linear(x, w, b):
        return op.gelu(op.matmul(x, w, tile_shape=tile) + b)
    return linear


def linear_args(m=512, k=256, n=1024):
    return op.tensor((m, k), BF16), op.tensor((k, n), BF16), op.tensor((n,), BF16)


def compiled(kernel, args, arch=H100, tuning=None):
    traced = kernel.traced(kernel.bind(*args))
    return compile_program(traced.graph, arch, tuning, traced.pins)


@pytest.mark.parametrize("arch", [A100, H100], ids=["sm80", "sm90"])
def test_the_pinned_tile_is_the_fused_gemm_kernels_schedule(arch):
    unpinned = compiled(pinned_linear(None), linear_args(), arch)
    default = tile_of(dict(unpinned.schedules)[0])
    tile = (64, 128, 32) if default != (64, 128, 32) else (128, 64, 32)
    program = compiled(pinned_linear(tile), linear_args(), arch)
    [step] = program.plan.steps
    assert step.op == "gemm"                        # the pin survives the bias + gelu epilogue fusion
    assert tile_of(dict(program.schedules)[0]) == tile
    [pinned] = program.pinned
    assert pinned.step == 0 and pinned.tuning.chosen_by == "pinned" and tile_of(pinned.tuning.default) == default
    [kernel] = generated_kernels(program)
    assert "x".join(map(str, tile)) in kernel.source.name


def test_a_two_number_tile_leaves_the_k_depth_to_the_cost_model():
    program = compiled(pinned_linear((128, 64)), linear_args(), A100)
    assert tile_of(dict(program.schedules)[0])[:2] == (128, 64)


def test_a_batched_product_is_pinned_by_its_batch_and_dims():
    @op.kernel
    def bmm(a, b):
        return op.matmul(a, b, tile_shape=(64, 64, 32))
    program = compiled(bmm, (op.tensor((3, 200, 96), BF16), op.tensor((3, 96, 160), BF16)), A100)
    assert [p.pin.batch for p in program.pinned] == [(3,)]
    assert tile_of(dict(program.schedules)[0]) == (64, 64, 32)


def test_a_tile_the_kernel_cannot_run_names_the_product_and_the_tiles_it_has():
    with pytest.raises(ArgumentError) as e:
        pinned_linear((48, 128, 32)).program(*linear_args())
    text = str(e.value)
    assert "tile_shape=(48, 128, 32) on the 512×1024×256 matmul" in text
    assert "a: bf16[512,256], b: bf16[256,1024]" in text
    assert "test_schedule_pins.py" in text                      # the user's line
    assert "(64, 128, 32)" in e.value.hint                      # what it can run instead


def test_a_k_depth_the_dtype_lacks_takes_the_nearest_with_a_warning():
    @op.kernel
    def mm(a, b):
        return op.matmul(a, b, tile_shape=(128, 128, 64))      # bf16's depth; float32's are shallower
    args = op.tensor((1024, 1024), "float32"), op.tensor((1024, 1024), "float32")
    with pytest.warns(PinWarning, match=r"takes bk in \[.*\] with a 128x128 tile; pinned \(128, 128, 16\)"):
        program = compiled(mm, args)
    assert tile_of(dict(program.schedules)[0]) == (128, 128, 16)


@pytest.mark.parametrize("tile", [(128,), (128, 128, 64, 2), (0, 64), (64.0, 64), "128x128", True])
def test_a_malformed_tile_shape_is_refused_with_the_form_it_takes(tile):
    with pytest.raises(AttributeValueError, match=r"tile_shape must be \(bm, bn\) or \(bm, bn, bk\)") as e:
        op.matmul(op.tensor((64, 64), BF16), op.tensor((64, 64), BF16), tile_shape=tile)
    assert e.value.op == "matmul" and "a: bf16[64,64]" in str(e.value)


def test_a_pin_no_gemm_kernel_takes_warns_and_names_the_plans_kernels():
    @op.kernel
    def attention(q, k, v):
        s = op.matmul(q, k.mT, tile_shape=(64, 64)) * 0.125
        return op.softmax(s, axis=-1) @ v
    q = op.tensor((2, 4, 256, 64), BF16)
    with pytest.warns(PinWarning, match=r"2×4×256×256×64 matmul .* is not used: .*its kernels: flash_attention"):
        program = attention.program(q, q, q)
    assert program.pinned == ()


def test_equal_products_pinned_to_different_tiles_are_refused():
    @op.kernel
    def two(a, b, c):
        return op.matmul(a, b, tile_shape=(64, 64)) + op.matmul(c, b, tile_shape=(128, 64))
    t = op.tensor((256, 256), BF16)
    with pytest.raises(ArgumentError, match="two matmuls of the same shape pin different tiles"):
        two.program(t, t, t)


def test_equal_products_pinned_alike_pin_each_step_once_and_warn_of_nothing():
    @op.kernel
    def two(a, b, c):
        left = op.matmul(a, b, tile_shape=(64, 64))
        right = op.matmul(c, b, tile_shape=(64, 64))        # a second pin, from another line
        return left @ right
    t = op.tensor((256, 256), BF16)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", PinWarning)
        program = compiled(two, (t, t, t))
    steps = [p.step for p in program.pinned]      # all three products are 256³: a pin names its dims
    assert len(steps) == len(set(steps)) == 3


def test_tuning_leaves_the_pinned_kernel_alone_and_tunes_the_others(tmp_path):
    @op.kernel
    def mlp(x, w1, w2):
        h = op.relu(op.matmul(x, w1, tile_shape=(64, 64, 32)))
        return op.matmul(h, w2)
    args = (op.tensor((512, 256), BF16), op.tensor((256, 512), BF16), op.tensor((512, 128), BF16))
    settings = TuneSettings(method="cost_model", cache="pins", cache_root=str(tmp_path))
    program = compiled(mlp, args, A100, settings)
    by_step = {i: k for i, k in zip(program.tuning.tuning.steps, program.tuning.tuning.kernels)}
    pinned = [k for k in by_step.values() if k.chosen_by == "pinned"]
    tuned = [k for k in by_step.values() if k.chosen_by == "cost_model"]
    assert len(pinned) == 1 and len(tuned) == 1
    assert tile_of(pinned[0].schedule) == (64, 64, 32) and pinned[0].search is None
    assert tuned[0].search is not None and len(tuned[0].trials) > 1
    kernel_records = [r for r in settings.open_cache().records(A100) if not r.op_name.startswith("program:")]
    assert [r.shapes for r in kernel_records] == [((512, 512), (512, 128))]   # none of the pinned kernel


def test_explain_says_which_step_is_pinned_and_where():
    text = str(pinned_linear((64, 128, 32)).explain(*linear_args()))
    assert "pinned: step 0 gemm runs 64x128x32" in text
    assert "tile_shape=(64, 128, 32) on the 512×1024×256 matmul" in text and "not tuned" in text


def test_eager_pinned_matmul_matches_numpy():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((70, 48)).astype(np.float32), rng.standard_normal((48, 90)).astype(np.float32)
    np.testing.assert_allclose(op.matmul(a, b, tile_shape=(64, 64)), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_the_generated_kernel_runs_the_pinned_tile_on_ragged_edges(monkeypatch):
    import tessera_rw.codegen.emulator_plan as emulator_plan
    ran = []
    real = emulator_plan.run_plan_emulated

    def spy(plan, values, **kw):
        ran.append(kw["schedules"])
        return real(plan, values, **kw)
    monkeypatch.setattr(emulator_plan, "run_plan_emulated", spy)
    monkeypatch.setenv("TESSERA_DEVICE", "emulator")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((100, 72)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((72, 136)).astype(ml_dtypes.bfloat16)
    got = op.matmul(a, b, tile_shape=(64, 128, 32))               # eager: compiled, since it is pinned
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) < 1e-2
    [schedules] = ran
    assert [tile_of(s) for s in schedules.values()] == [(64, 128, 32)]


def test_eager_calls_on_numpy_without_a_pin_compile_nothing(monkeypatch):
    import tessera_rw.eager as eager
    monkeypatch.setattr(eager, "compile_program", lambda *a, **k: pytest.fail("compiled an unpinned eager call"))
    eager._program.cache_clear()
    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(op.matmul(x, x), x @ x)


def test_placeholders_take_a_pin_and_give_the_result_type():
    y = op.matmul(op.tensor((4, 64, 32), BF16), op.tensor((32, 48), BF16), tile_shape=(64, 64))
    assert y.shape == (4, 64, 48)


def test_a_gradient_program_keeps_the_pin_on_the_forward_product_it_recomputes():
    def loss(x, w):
        h = op.matmul(x, w, tile_shape=(64, 128, 32))
        return op.sum(op.gelu(h))
    g = op.grad(loss, argnums=(0, 1))
    x, w = op.tensor((256, 128), BF16), op.tensor((128, 512), BF16)
    program = g.program(x, w)
    [pinned] = program.pinned                         # gelu' needs the forward product again
    assert (pinned.pin.m, pinned.pin.n, pinned.pin.k) == (256, 512, 128)
    assert tile_of(dict(program.schedules)[pinned.step]) == (64, 128, 32)


def test_tuning_a_kernel_whose_every_product_is_pinned_says_so():
    @op.kernel
    def pinned(a, b):
        return op.matmul(a, b, tile_shape=(64, 64, 32))
    cfg = autotune(pinned, shapes=((256, 256), (256, 256)), dtype="bf16", method="cost_model", cache=None)
    assert cfg.chosen_by is ChosenBy.PINNED and "(pinned," in repr(cfg)
