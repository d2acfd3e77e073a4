"""A batch norm's training step as a plan: the normalized x, the affine result and the relu's mask
are computed again by each kernel that reads them (from x, which those kernels read anyway, and
per-channel values that stay in cache) instead of written and read back, the per-channel sums
that need nothing from one another are one multi_reduction kernel reading x once, and the sum of
g·(x − μ) that μ's gradient adds (zero) is left out; the plan run on the numpy executor and the CPU
emulator against float64 numpy."""

from __future__ import annotations

import numpy as np

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.emulator_plan import run_plan_emulated

AXES = (0, 2, 3)
EPS = 1e-5


def batch_norm_relu(x, g, b):
    mu = op.mean(x, axis=AXES, keepdims=True)
    var = op.mean((x - mu) * (x - mu), axis=AXES, keepdims=True)
    return op.relu((x - mu) / op.sqrt(var + EPS) * g + b)


step = op.grad(lambda x, g, b: op.sum(batch_norm_relu(x, g, b)), argnums=(0, 1, 2))


def reference(x, g, b):
    """dx, dg, db of sum(relu(batch_norm(x) * g + b)) in float64."""
    x, g, b = (np.asarray(a, np.float64) for a in (x, g, b))
    mu, sd = x.mean(AXES, keepdims=True), np.sqrt(x.var(AXES, keepdims=True) + EPS)
    xh = (x - mu) / sd
    dy = (xh * g + b > 0).astype(np.float64)
    dxh = dy * g
    dx = (dxh - dxh.mean(AXES, keepdims=True) - xh * (dxh * xh).mean(AXES, keepdims=True)) / sd
    return dx, (dy * xh).sum(AXES, keepdims=True), dy.sum(AXES, keepdims=True)


def inputs(shape, rng):
    channels = (1, shape[1], 1, 1)
    return ((rng.standard_normal(shape) * 2 + 0.5).astype(np.float32),
            (rng.random(channels) + 0.5).astype(np.float32), (rng.standard_normal(channels) * 0.5).astype(np.float32))


def test_the_step_reads_x_instead_of_writing_what_it_computes_from_it():
    shape = (32, 64, 56, 56)                              # a ResNet stage's activations, f32
    plan = step.program(op.tensor(shape, "f32"), op.tensor((1, 64, 1, 1), "f32"), op.tensor((1, 64, 1, 1), "f32")).plan
    full = 4 * int(np.prod(shape))
    assert all(b.nbytes < full for b in plan.buffers if b.role.name == "TEMP")     # no temporary of x's size
    assert "bool" not in str(plan)                                                  # no mask written
    reads_of_x = [s.op for s in plan.steps if any(i.type.shape == shape for i in s.inputs)]
    # the mean, the variance, Σdy·x̂ / Σdy / Σdy·g/σ together, and dx (μ's gradient sums g·(x − μ)
    # over the channel: zero, left out)
    assert reads_of_x == ["mean", "fused_reduction", "multi_reduction", "fused_elementwise"]
    assert len(plan.steps) == 4           # σ = sqrt(var + eps) and the per-channel terms computed where read


def test_the_step_computes_the_gradients():
    x, g, b = inputs((4, 8, 6, 5), np.random.default_rng(31))
    program = step.program(x, g, b)
    for got, want in zip(step(x, g, b), reference(x, g, b)):
        np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want, rtol=2e-4, atol=2e-4)
    if emulator.available():
        emulated = run_plan_emulated(program.plan, {"x": x, "g": g, "b": b})
        for got, want in zip(emulated, reference(x, g, b)):
            np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want, rtol=2e-4, atol=2e-4)


def test_two_layers_compute_nothing_twice():
    """The second layer's sums read what the first layer's feed: each group reads the other's
    views (a group built over the program as extracted kept the old chain alive beside it)."""
    two = op.grad(lambda x, g, b: op.sum(batch_norm_relu(batch_norm_relu(x, g, b), g, b)), argnums=(0, 1, 2))
    channel = op.tensor((1, 64, 1, 1), "f32")
    plan = two.program(op.tensor((32, 64, 56, 56), "f32"), channel, channel).plan
    assert len(plan.steps) <= 20                  # 27 where the first group's chain was kept alive beside it
    x, g, b = inputs((4, 8, 6, 5), np.random.default_rng(32))
    program = two.program(x, g, b)
    want = [np.asarray(w, np.float64) for w in two(x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))]
    runs = [two(x, g, b)] + ([run_plan_emulated(program.plan, {"x": x, "g": g, "b": b})] if emulator.available() else [])
    for got in runs:
        for a, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(a, np.float64).reshape(w.shape), w, rtol=5e-4, atol=5e-4)


def test_op_batch_norm_plans_as_the_written_out_one():
    step_op = op.grad(lambda x, w, b: op.sum(op.relu(op.batch_norm(x, weight=w, bias=b))), argnums=(0, 1, 2))
    plan = step_op.program(op.tensor((32, 64, 56, 56), "f32"), op.tensor((64,), "f32"), op.tensor((64,), "f32")).plan
    assert [s.op for s in plan.steps].count("multi_reduction") == 1 and len(plan.steps) == 4
    x, g, b = inputs((4, 8, 6, 5), np.random.default_rng(33))
    for got, want in zip(step_op(x, g.ravel(), b.ravel()), reference(x, g, b)):
        np.testing.assert_allclose(np.asarray(got, np.float64).reshape(want.shape), want, rtol=2e-4, atol=2e-4)
