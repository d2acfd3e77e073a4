"""The kernel templates tessera_rw generates code from, found by the op a kernel computes.

Lazy and explicit: the table names each template's module and class; modules load on first use.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> t = TensorType((64, 64), DType.bfloat16)
>>> softmax = KernelOp.of("softmax", (t,), t, axis=1)
>>> [tpl.kind_of(softmax) for tpl in templates_for(softmax)]
['softmax']
"""

from __future__ import annotations

import importlib
from functools import cache

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Template
from tessera_rw.codegen.templates.plugin_templates import plugin_templates
from tessera_rw.lower.lowering import SOURCE_OPS, VIEW_OPS

# Ops that launch nothing: graph inputs and constants are already in memory, and a reshape of a
# dense value is the same bytes. A slice that is one aligned contiguous run is a view too
# (`lowering.view_offset`; the cost model checks it per op). Other layout ops (transpose,
# broadcast_to, strided slices) are copy kernels, as lowering plans them: every kernel reads dense operands.
NO_KERNEL_OPS = SOURCE_OPS | VIEW_OPS

BUILTIN = (
    ("gemm", "GemmTemplate"),
    ("attention", "FlashAttentionTemplate"),
    ("attention_backward", "AttentionRowStatsTemplate"),
    ("attention_backward", "FlashAttentionBwdTemplate"),
    ("attention_stats", "AttentionStatsFromLseTemplate"),
    ("rowwise", "RowwiseTemplate"),
    ("rowwise_reduced", "ReducedRowwiseTemplate"),
    ("rowwise_logsumexp", "LogsumexpRowTemplate"),
    ("norm_backward", "NormBackwardTemplate"),
    ("norm_backward_grads", "NormBackwardGradsTemplate"),
    ("reduction", "ReductionTemplate"),
    ("reduction_outputs", "MultiReductionTemplate"),
    ("elementwise", "ElementwiseTemplate"),
    ("elementwise_outputs", "MultiElementwiseTemplate"),
    ("copy", "CopyTemplate"),
    ("gather", "TakeTemplate"),
    ("index_add", "IndexAddTemplate"),
    ("pooling", "PoolTemplate"),
    ("conv", "DirectConvTemplate"),
    ("spectral", "SpectralContractTemplate"),
    ("spectral", "FFTTemplate"),
)


@cache
def builtin_templates() -> tuple[Template, ...]:
    """One instance of every built-in template."""
    return tuple(getattr(importlib.import_module(f"tessera_rw.codegen.templates.{module}"), name)()
                 for module, name in BUILTIN)


def templates() -> tuple[Template, ...]:
    """The built-in templates, then the installed plugins' (plugin_templates.py)."""
    builtin = builtin_templates()
    return builtin + plugin_templates(builtin)


def templates_for(op: KernelOp) -> list[Template]:
    """The templates that can implement `op` (usually one)."""
    return [t for t in templates() if op.op in t.ops and t.accepts(op)]


def refusal(op: KernelOp) -> str | None:
    """Why no template takes `op`: the reasons of those implementing its name (None when one takes
    it, or when none implements it)."""
    reasons = [t.refusal(op) for t in templates() if op.op in t.ops]
    return None if not reasons or not all(reasons) else "; ".join(dict.fromkeys(reasons))


class NoTemplateError(TesseraError):
    """No GPU template implements an op (or some kernels of a plan: the message lists them)."""


def template_for(op: KernelOp) -> Template:
    """The template that implements `op`: the first of templates_for (the cost model and every
    executor take the same one), or NoTemplateError saying what to do."""
    found = templates_for(op)
    if not found:
        why = refusal(op)
        raise NoTemplateError(f"no GPU kernel template takes this op{': ' + why if why else ''}", op=op.op,
                              operands=str(op),
                              hint="float64 and a few rare ops run on the host only: run it with the numpy "
                                   "executor, or register a template for it")
    return found[0]
