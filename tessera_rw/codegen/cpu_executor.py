"""The numpy executor of KernelPlans: a plan runs on the host, kernel by kernel, buffer by buffer.

It executes the plan a GPU would — the same kernels in the same order, writing the same reused
buffers — so a plan is verified without a device. Each kernel computes with its op's numpy
reference at the node's dtype (16-bit floats widened to float32, rounded where a kernel rounds),
except where the reference would not fit: flash attention (over strided views too) and its
backward run block by block in bounded memory (cpu_attention, cpu_attention_backward), and the
fft family runs through scipy.fft (numpy.fft's semantics; numpy 2's rfft of float32 is several
times slower).
Under the `kahan_sum` policy, sums and means accumulate with compensation, as the kernels do.

>>> import numpy as np
>>> from tessera_rw.algebra.builder import make, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.graph import Graph
>>> from tessera_rw.lower.lowering import lower
>>> x = make_input("x", (2, 3), DType.float32)
>>> plan = lower(Graph("f", (x,), (make("softmax", make("exp", x), axis=1),)))
>>> run_plan_on_cpu(plan, {"x": np.zeros((2, 3), np.float32)})[0][0]
array([0.33333334, 0.33333334, 0.33333334], dtype=float32)
"""

from __future__ import annotations

import warnings
from typing import Callable, Mapping

import numpy as np
import scipy.fft

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.evaluate import evaluate_node, widened
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops.fused_expr import fused
from tessera_rw.algebra.ops.multi_output import padded_rows
from tessera_rw.algebra.ops.strided_attention import viewed, written_through
from tessera_rw.algebra.ops.strided_attention_backward import on_views
from tessera_rw.codegen.cpu_attention import flash_attention_blockwise, flash_attention_lse_blockwise
from tessera_rw.codegen.cpu_attention_backward import bwd_blockwise, row_stats_blockwise
from tessera_rw.codegen.numerics import Numerics, compensated_sum
from tessera_rw.codegen.step_timing import PlanRun, active_recorders, host_clock, report_step
from tessera_rw.lower.plan import BufferRole, KernelPlan, Step, ValueRef

HostKernel = Callable[[Node, list[np.ndarray]], np.ndarray]


def _flash_attention(node: Node, args: list[np.ndarray]) -> np.ndarray:
    return flash_attention_blockwise(*args, **node.attr_map)


def _strided_attention(node: Node, args: list[np.ndarray]) -> np.ndarray:
    a = node.attr_map
    o = flash_attention_blockwise(*viewed(args, a["shapes"], a["strides"], a["offsets"]), scale=a["scale"],
                                  causal=a["causal"], has_mask=a["has_mask"], window=a.get("window", 0))
    return written_through(o, a["shape"], a["out_strides"])


def _on_views(kernel: Callable[..., np.ndarray]) -> HostKernel:
    """The host form of a strided attention backward op: `kernel`, its base op's, over its views."""
    return lambda node, args: on_views(node.op, kernel, tuple(args), node.attr_map)


def _compensated(node: Node, args: list[np.ndarray]) -> np.ndarray:
    return _compensated_of(args[0], node.op, node.attr("axes"), node.attr("keepdims", False))


def _compensated_of(x: np.ndarray, reduce: str, axes, keepdims: bool) -> np.ndarray:
    x = x.astype(np.float32) if x.dtype.itemsize < 4 and x.dtype.kind == "f" else x
    total = compensated_sum(x, axes, keepdims)
    if reduce == "mean":
        total = total / np.prod([x.shape[a] for a in axes], dtype=np.float64).astype(total.dtype)
    return total


def _compensated_multi(node: Node, args: list[np.ndarray]) -> np.ndarray:
    """A multi_reduction's sums or means each compensated, as its kernel's are under kahan_sum."""
    a = node.attr_map
    if a["reduce"] not in ("sum", "mean"):
        return evaluate_node(node, args)
    sums = []
    for expr in a["exprs"].split(";"):
        values = np.asarray(fused(*args, expr=expr))
        sums.append(_compensated_of(values, a["reduce"], tuple(ax % values.ndim for ax in a["axes"]), a["keepdims"]))
    return padded_rows(sums, a["width"])


def _scipy_transform(name: str) -> HostKernel:
    """A transform of the fft family through scipy.fft, which takes numpy.fft's n, axis and norm.
    numpy 2's rfft of a real float32 signal runs several times slower (16 x 16384 points: 2.7 ms
    against 0.44)."""
    transform = getattr(scipy.fft, name)

    def kernel(node: Node, args: list[np.ndarray]) -> np.ndarray:
        a = node.attr_map
        return transform(*widened(args), n=a["n"], axis=a["axis"], norm=a["norm"])
    return kernel


# Kernels whose host form differs from the op's reference; every other op runs its reference.
HOST_KERNELS: dict[str, HostKernel] = {
    "flash_attention": _flash_attention,
    "strided_attention": _strided_attention,
    "flash_attention_lse": lambda node, args: flash_attention_lse_blockwise(*args, **node.attr_map),
    "attention_row_stats": lambda node, args: row_stats_blockwise(*args, **node.attr_map),
    "flash_attention_bwd": lambda node, args: bwd_blockwise(*args, **node.attr_map),
    "strided_attention_lse": _on_views(flash_attention_lse_blockwise),
    "strided_attention_bwd": _on_views(bwd_blockwise),
    **{name: _scipy_transform(name) for name in ("fft", "ifft", "rfft", "irfft")},
}
COMPENSATED_KERNELS: dict[str, HostKernel] = {"sum": _compensated, "mean": _compensated,
                                              "multi_reduction": _compensated_multi}


def host_kernel(node: Node, args: list[np.ndarray], numerics: Numerics = Numerics.DETERMINISTIC) -> np.ndarray:
    """One kernel's result on the host, at the node's dtype, under a numerics policy."""
    special = HOST_KERNELS.get(node.op)
    if numerics is Numerics.KAHAN_SUM:
        special = COMPENSATED_KERNELS.get(node.op, special)
    if special is None:
        return evaluate_node(node, args)
    return np.asarray(special(node, args)).astype(node.dtype.numpy, copy=False)


class HostMemory:
    """The plan's buffers as host byte arrays; a value is a dense view of one of them, from its offset."""

    def __init__(self, plan: KernelPlan, feeds: Mapping[str, np.ndarray]):
        self.bytes: dict[int, np.ndarray] = {}
        for b in plan.buffers:
            if b.role is not BufferRole.INPUT:
                self.bytes[b.id] = np.empty(b.nbytes, np.uint8)
        for name, ref in plan.inputs:
            if name not in feeds:
                raise ArgumentError(f"plan {plan.name}: no value for input {name!r}",
                                    hint=f"pass every input: {[n for n, _ in plan.inputs]}")
            value = np.asarray(feeds[name])
            if value.shape != ref.type.shape:
                raise ArgumentError(f"plan {plan.name}: input {name!r} has shape {value.shape}, "
                                    f"the plan was built for {ref.type.shape}")
            dense = np.ascontiguousarray(value.astype(ref.type.dtype.numpy, copy=False))
            self.bytes[ref.buffer] = dense.reshape(-1).view(np.uint8)
        for node, ref in plan.constants:
            self.write(ref, evaluate_node(node, []))

    def view(self, ref: ValueRef) -> np.ndarray:
        raw = self.bytes[ref.buffer][ref.offset:ref.end]
        return raw.view(ref.type.dtype.numpy).reshape(ref.type.shape)

    def write(self, ref: ValueRef, value: np.ndarray) -> None:
        np.copyto(self.view(ref), np.asarray(value), casting="unsafe")


def run_step(step: Step, memory: HostMemory, numerics: Numerics = Numerics.DETERMINISTIC) -> None:
    memory.write(step.output, host_kernel(step.node, [memory.view(r) for r in step.inputs], numerics))


def run_plan_on_cpu(plan: KernelPlan, feeds: Mapping[str, np.ndarray],
                    numerics: Numerics = Numerics.DETERMINISTIC) -> tuple[np.ndarray, ...]:
    """Run `plan` on the host with inputs by name; the outputs are fresh arrays. Arithmetic is IEEE's,
    as on the GPU: an inf or NaN the inputs lead to is a value, not a numpy warning."""
    memory = HostMemory(plan, feeds)
    recorders = active_recorders()
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # numpy's "Mean of empty slice": NaN is the value
        if recorders:                       # profiled: every step timed by the wall clock
            run = PlanRun(plan, numerics)
            for i, step in enumerate(plan.steps):
                start = host_clock()
                run_step(step, memory, numerics)
                report_step(recorders, run, i, start, host_clock() - start)
        else:
            for step in plan.steps:
                run_step(step, memory, numerics)
    return tuple(memory.view(ref).copy() for ref in plan.outputs)
