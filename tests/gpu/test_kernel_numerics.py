"""Every generated kernel against its op's numpy reference, on the GPU of this machine.

For each template, every sample at every default schedule for this GPU's architecture, and then
ops with ragged edges (tests/codegen/ragged_ops.py). Inputs are random and never zero; the output
buffer is filled with NaN bytes before each launch, so an element the kernel never writes fails;
the reference runs in float64 on the same rounded inputs, and the tolerance is the output dtype's
(tessera_rw/codegen/kernel_check.py derives it). One sample's reference serves all its schedules, and
the failures of every schedule are reported together.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tessera_rw.codegen.kernel_check import check, expected
from tessera_rw.codegen.kernel_inputs import random_inputs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.base import Template
from tessera_rw.codegen.templates.registry import templates, templates_for
from tests.codegen.ragged_ops import RAGGED
from tests.codegen.schedule_check import check_schedules as check_on, rng_for as _rng

pytestmark = pytest.mark.gpu

POISON = 0xFF     # every byte: NaN in any float type, -1 in the integers

SAMPLES = [pytest.param(t, i, id=f"{type(t).__name__}-{i}-{op.op}")
           for t in templates() for i, op in enumerate(t.samples())]


def run_poisoned(op: KernelOp, arrays, schedule, arch) -> np.ndarray:
    """run_kernel's steps, with the output buffer filled with POISON before the launch."""
    from cuda.core import Buffer
    from tessera_rw.codegen.launch import finish, launch, prepare
    p = prepare(op, arrays, schedule=schedule, arch=arch)
    out = p.args[-1]
    if out.nbytes:
        Buffer.from_handle(out.ptr, out.nbytes, owner=out.owner).fill(POISON, stream=p.stream)
    launch(p.source, p.compiled, p.args, p.stream)
    return finish(p)


def check_every_schedule(template: Template, op: KernelOp) -> None:
    from tessera_rw.codegen.arch import current_arch
    arch = current_arch()
    if reason := template.unavailable(op, arch):
        pytest.skip(reason)
    schedules = template.schedules(op, arch)
    assert schedules, f"{type(template).__name__} has no default schedule for {op} on {arch.name}"
    if template.library is not None:
        pytest.skip(f"{op.op} runs as a {template.library} call: no generated kernel to check")
    check_schedules(template, op, schedules, arch)


def check_schedules(template: Template, op: KernelOp, schedules, arch) -> None:
    """schedule_check.check_schedules on this machine's GPU."""
    check_on(template, op, schedules, arch, run_poisoned)


@pytest.mark.parametrize("template, index", SAMPLES)
def test_sample_matches_reference_at_every_default_schedule(template, index):
    check_every_schedule(template, template.samples()[index])


@pytest.mark.parametrize("name", list(RAGGED))
def test_ragged_shape_matches_reference_at_every_default_schedule(name):
    op = RAGGED[name]
    found = templates_for(op)
    assert found, f"no template accepts {op}"
    check_every_schedule(found[0], op)


def test_run_kernel_numpy_in_numpy_out():
    from tessera_rw.codegen.launch import run_kernel
    op = RAGGED["softmax rows of 1000 bf16"]
    rng = _rng(op)
    inputs = random_inputs(op, rng)
    check(expected(op, inputs, rng), run_kernel(op, list(inputs.arrays)), f"run_kernel {op}")


def test_run_kernel_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    from tessera_rw.codegen.launch import run_kernel
    op = RAGGED["layernorm rows of 1000 bf16"]
    rng = _rng(op)
    inputs = random_inputs(op, rng)
    # through float32: every bf16 value is exact there, and torch reads no ml_dtypes arrays
    tensors = [torch.from_numpy(a.astype(np.float32)).to("cuda", torch.bfloat16) for a in inputs.arrays]
    out = run_kernel(op, tensors)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.dtype == torch.bfloat16
    host = out.float().cpu().numpy().astype(op.result.dtype.numpy)
    check(expected(op, inputs, rng), host, f"run_kernel on torch tensors {op}")


BACKWARD = FlashAttentionBwdTemplate()


@pytest.mark.parametrize("index", range(len(BACKWARD.samples())))
def test_attention_backward_under_fast_sums_dq_right_at_every_default_schedule(index):
    """Under `fast` the defaults add the form whose key blocks add dQ up in a workspace with atomics
    (dq="atomic"), the last to reach a query tile converting it: fences and counters the emulator,
    which runs blocks one after another, cannot put to the test."""
    op = replace(BACKWARD.samples()[index], numerics=Numerics.FAST)
    check_every_schedule(BACKWARD, op)


def test_a_bound_launch_zeroes_its_workspace_before_every_launch():
    """Three launches of one BoundLaunch: the dQ sum starts from zero each time (a sum left over
    from the launch before would double dQ), and only rounding order differs between them."""
    from tessera_rw.codegen.arch import current_arch
    from tessera_rw.codegen.launch import bind, finish, prepare
    op = replace(BACKWARD.samples()[2], numerics=Numerics.FAST)      # causal, ragged: 1000 rows
    arch = current_arch()
    schedule = next(s for s in BACKWARD.schedules(op, arch) if s.dq == "atomic")
    rng = _rng(op)
    inputs = random_inputs(op, rng)
    reference = expected(op, inputs, rng)
    p = prepare(op, inputs.arrays, schedule=schedule, arch=arch)
    bound = bind(p.source, p.compiled, p.args, p.stream)
    assert bound.workspace is not None and p.source.workspace_bytes > 0
    runs = []
    for i in range(3):
        bound()
        runs.append(np.asarray(finish(p)).astype(np.float64))
        check(reference.on(BACKWARD.resources(op, schedule, arch).unit), runs[-1].astype(op.result.dtype.numpy),
              f"launch {i + 1} of {op}")
    scale = np.abs(runs[0]).max()
    assert all(np.abs(r - runs[0]).max() <= 1e-2 * scale for r in runs[1:])
