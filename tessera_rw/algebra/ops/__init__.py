"""The op registry: every OpDef of every op module, by name."""

from __future__ import annotations

import difflib
from typing import Callable

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.opdef import OpDef
from tessera_rw.algebra.ops import (attention, attention_backward, conv, creation, elementwise, fused_conv, fused_expr,
                                    fused_gemm, fused_norm, fused_reduction, indexing, layout, linalg, multi_output,
                                    norm_backward, pooling, reduced_norm, reduction, spectral, strided,
                                    strided_attention, strided_attention_backward)

OPS: dict[str, OpDef] = {d.name: d for m in (creation, elementwise, reduction, layout, indexing, linalg, conv, spectral,
                                              attention, attention_backward, norm_backward, strided,
                                              strided_attention, strided_attention_backward, fused_gemm, fused_expr,
                                              fused_reduction, fused_norm, reduced_norm, fused_conv, multi_output,
                                              pooling)
                      for d in m.DEFS}
BUILTIN_OPS: frozenset[str] = frozenset(OPS)    # the ops tessera_rw declares itself; plugins add others


def register(op: OpDef) -> OpDef:
    """Add an op declared outside tessera_rw (a rule plugin's fused op). Names are unique."""
    existing = OPS.get(op.name)
    if existing is not None and existing is not op:
        raise TesseraError(f"op {op.name!r} is already declared", hint="choose another name for the plugin's op")
    OPS[op.name] = op
    return op


def unregister(op: OpDef) -> None:
    """Take back an op `register` added (a plugin found unusable after its ops were declared)."""
    if op.name in BUILTIN_OPS:
        raise TesseraError(f"op {op.name!r} is built in and cannot be unregistered")
    if OPS.get(op.name) is op:
        del OPS[op.name]


# What declares the ops of installed plugins, on the first lookup of an op not declared yet (the
# rules layer installs it: plugins are found there, and algebra imports nothing above itself).
_PLUGIN_OPS: list[Callable[[], object]] = []


def on_unknown_op(declare_plugin_ops: Callable[[], object]) -> None:
    """Have `declare_plugin_ops()` run when an op name is looked up that is not declared yet."""
    _PLUGIN_OPS[:] = [declare_plugin_ops]


def opdef(name: str) -> OpDef:
    if name not in OPS and _PLUGIN_OPS:
        _PLUGIN_OPS[0]()
    try:
        return OPS[name]
    except KeyError:
        close = difflib.get_close_matches(name, OPS, n=3)
        raise TesseraError(f"unknown op {name!r}" + (f"; did you mean {', '.join(map(repr, close))}?" if close else
                                                     f"; known ops: {', '.join(sorted(OPS))}")) from None
