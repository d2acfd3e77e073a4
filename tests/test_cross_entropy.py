"""Cross-entropy, however it is written, reads the logits once: log_softmax, the row sum against
the labels and the row's loss are one row kernel (a reduced_normalization) followed by the batch
mean, checked in the CPU emulator against float64 numpy on random logits; and its gradient still
runs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from scipy.special import log_softmax

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.codegen.emulator_plan import run_plan_emulated

pytestmark = pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")


@op.kernel
def with_log_softmax(logits, labels):
    return -op.mean(op.sum(op.log_softmax(logits, axis=-1) * labels, axis=-1))


@op.kernel
def written_out(logits, labels):
    shifted = logits - op.max(logits, axis=-1, keepdims=True)
    log_probs = shifted - op.log(op.sum(op.exp(shifted), axis=-1, keepdims=True))
    return -op.mean(op.sum(log_probs * labels, axis=-1))


@op.kernel
def summed_over_the_batch(logits, labels):
    return -op.sum(op.log_softmax(logits, axis=-1) * labels) / logits.shape[0]


@op.kernel
def with_class_indices(logits, classes):
    hit = classes[:, None] == op.arange(logits.shape[-1], dtype="int32")
    return -op.mean(op.sum(op.where(hit, op.log_softmax(logits, axis=-1), 0.0), axis=-1))


@op.kernel
def taken_along_the_classes(logits, classes):
    return -op.mean(op.take_along_axis(op.log_softmax(logits, axis=-1), classes[:, None], axis=-1))


BY_INDEX = (with_class_indices, taken_along_the_classes)


def _problem(rows: int, vocab: int, dtype, rng: np.random.Generator):
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(dtype)
    classes = rng.integers(0, vocab, size=rows).astype(np.int32)
    want = -np.mean(log_softmax(logits.astype(np.float64), axis=-1)[np.arange(rows), classes])
    return logits, classes, want


@pytest.mark.parametrize("vocab", [1000, 8003])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("loss", [with_log_softmax, written_out, summed_over_the_batch, *BY_INDEX],
                         ids=lambda k: k.__name__)
def test_the_loss_is_one_row_kernel_reading_the_logits_once(loss, dtype, vocab):
    logits, classes, want = _problem(48, vocab, dtype, np.random.default_rng(vocab))
    labels = classes if loss in BY_INDEX else np.eye(vocab, dtype=dtype)[classes]
    program = loss.program(logits, labels)
    row_kernels = [s for s in program.plan.steps if s.op == "reduced_normalization"]
    assert len(row_kernels) == 1 and len(program.plan.steps) <= 4, program.plan
    reads = program.candidate.kernels[[s.op for s in program.plan.steps].index("reduced_normalization")]
    assert reads.hbm_bytes < logits.nbytes + labels.nbytes + 4 * logits.shape[0] + 2 ** 20
    inputs = {"logits": logits, ("classes" if loss in BY_INDEX else "labels"): labels}
    (got,), (host,) = run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs)
    bound = 2e-2 if dtype is ml_dtypes.bfloat16 else 1e-5
    assert abs(float(got) - want) <= bound * abs(want)
    assert abs(float(host) - want) <= bound * abs(want)


def test_a_mean_over_every_axis_of_a_sequence_batch_reads_the_logits_once():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 7, 500)).astype(ml_dtypes.bfloat16)
    labels = np.eye(500, dtype=ml_dtypes.bfloat16)[rng.integers(0, 500, size=(3, 7))]
    loss = op.kernel(lambda logits, labels: -op.mean(op.log_softmax(logits, axis=-1) * labels))
    plan = loss.program(logits, labels).plan
    assert [s.op for s in plan.steps][0] == "reduced_normalization" and len(plan.steps) == 2, plan
    want = -np.mean(log_softmax(logits.astype(np.float64), axis=-1) * labels.astype(np.float64))
    (got,) = run_plan_emulated(plan, {"logits": logits, "labels": labels})
    assert abs(float(got) - want) <= 2e-2 * abs(want)


def test_a_sum_across_the_rows_of_a_softmax_stays_a_reduction():
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    columns = op.kernel(lambda x: op.sum(op.softmax(x, axis=-1) * x, axis=0))
    program = columns.program(x)
    assert "reduced_normalization" not in [s.op for s in program.plan.steps]
    assert np.allclose(columns(x), np.sum(np.exp(log_softmax(x, axis=-1)) * x, axis=0), rtol=1e-5, atol=1e-6)


def test_the_gradient_of_the_loss_matches_numpy():
    rng = np.random.default_rng(3)
    logits, classes, _ = _problem(16, 300, np.float32, rng)
    labels = np.eye(300, dtype=np.float32)[classes]
    dlogits = op.grad(with_log_softmax)(logits, labels)
    probs = np.exp(log_softmax(logits.astype(np.float64), axis=-1))
    assert np.allclose(dlogits, (probs - labels) / 16, atol=1e-6)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=["bf16", "f32"])
def test_the_gradient_of_a_loss_over_class_indices_reads_the_logits_once(dtype):
    """softmax(z) - onehot(c), over the batch: the selection's cotangent is computed in the row kernel's
    epilogue from the indices, never written at the logits' size."""
    rng = np.random.default_rng(8)
    logits, classes, _ = _problem(40, 1000, dtype, rng)
    program = op.grad(taken_along_the_classes).program(logits, classes)
    assert program.plan.temp_bytes < logits.nbytes // 8, program.plan
    inputs = {"logits": logits, "classes": classes}
    (got,), (host,) = run_plan_emulated(program.plan, inputs), run_plan_on_cpu(program.plan, inputs)
    want = (np.exp(log_softmax(logits.astype(np.float64), axis=-1)) - np.eye(1000)[classes]) / 40
    bound = 2e-2 if dtype is ml_dtypes.bfloat16 else 1e-5
    for value in (got, host):
        assert np.abs(value.astype(np.float64) - want).max() <= bound * np.abs(want).max()


@pytest.mark.parametrize("smoothing, ignore", [(0.1, None), (0.0, -100), (0.2, -100)])
def test_op_cross_entropy_smoothed_or_ignoring_is_right_in_the_emulator(smoothing, ignore):
    rng = np.random.default_rng(12)
    logits, classes, _ = _problem(48, 1000, ml_dtypes.bfloat16, rng)
    if ignore is not None:
        classes[::5] = ignore
    loss = op.kernel(lambda logits, classes: op.cross_entropy(logits, classes, label_smoothing=smoothing,
                                                              ignore_index=ignore))
    plan = loss.program(logits, classes).plan
    assert [s.op for s in plan.steps].count("reduced_normalization") == 1, plan
    valid = classes != (ignore if ignore is not None else -1)
    q = np.eye(1000)[np.where(valid, classes, 0)] * (1 - smoothing) + smoothing / 1000
    rows = -(q * log_softmax(logits.astype(np.float64), axis=-1)).sum(-1) * valid
    want = rows.sum() / valid.sum()
    (got,) = run_plan_emulated(plan, {"logits": logits, "classes": classes})
    assert abs(float(got) - want) <= 2e-2 * abs(want)


def test_integer_epilogue_operands_compare_exactly_beyond_float32s_integers():
    """Indices from 2**24 up are not all floats: the row kernel reads them as ints."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    ids = (2 ** 24 + 1 + 2 * np.arange(4)).astype(np.int32)[:, None]
    positions = (2 ** 24 + np.arange(8)).astype(np.int32)[None, :]
    picked = op.kernel(lambda x, ids, pos: op.sum(op.where(ids == pos, op.log_softmax(x, axis=-1), 0.0), axis=-1))
    plan = picked.program(x, ids, positions).plan
    assert "reduced_normalization" in [s.op for s in plan.steps], plan
    want = np.where(ids == positions, log_softmax(x.astype(np.float64), axis=-1), 0.0).sum(-1)
    (got,) = run_plan_emulated(plan, {"x": x, "ids": ids, "pos": positions})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("smoothing, ignore", [(0.0, None), (0.1, None), (0.0, -100)])
def test_the_gradient_of_op_cross_entropy_reads_the_logits_once_smoothed_or_not(smoothing, ignore):
    """The smoothed cotangent, where(hit, g, 0) + where(hit, 0, g) · r as reverse mode writes it, is
    one selection of two constants (rules/library/selections.py), computed where it is read; with
    rows ignored, the row kernel computes it from each row's cotangent (its epilogue then holds
    more than the registers keep beside a resident row: the row is walked in passes)."""
    rng = np.random.default_rng(9)
    logits, classes, _ = _problem(40, 1000, ml_dtypes.bfloat16, rng)
    if ignore is not None:
        classes[::4] = ignore
    kept = classes != -100

    def loss(logits, classes):
        return op.cross_entropy(logits, classes, label_smoothing=smoothing, ignore_index=ignore)
    plan = op.grad(loss).program(logits, classes).plan
    assert plan.temp_bytes < logits.nbytes // 8, plan
    (got,) = run_plan_emulated(plan, {"logits": logits, "classes": classes})
    target = np.eye(1000)[np.where(kept, classes, 0)] * (1 - smoothing) + smoothing / 1000
    want = (np.exp(log_softmax(logits.astype(np.float64), axis=-1)) - target) * kept[:, None] / kept.sum()
    assert np.abs(got.astype(np.float64) - want).max() <= 2e-2 * np.abs(want).max()
