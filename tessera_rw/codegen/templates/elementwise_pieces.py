"""A concatenated_elementwise as the strided_elementwise computations of its pieces.

Each piece is an expression over views of some of the operands, in the piece's own coordinates:
as a strided_elementwise over just the operands it reads (its expression renumbered to them), the
elementwise template emits and costs it as it does any other, and the kernel picks the piece of each
element by its coordinate along the concatenated axis.

>>> from tessera_rw.algebra.dtypes import DType
>>> x = TensorType((4, 8), DType.float32)
>>> cat = KernelOp.of("concatenated_elementwise", (x, x), x, exprs="neg($1);$0", axis=1, sizes=(4, 4),
...                   shape=(4, 8), strides=(0, 0, 8, 1, 8, 1, 0, 0), offsets=(0, 4, 0, 0))
>>> [(p.op.attr_map["expr"], p.operands, p.start) for p in pieces(cat)]
[('neg($0)', (1,), 0), ('$0', (0,), 4)]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops.fused_expr import expr_leaves, parse_expr, respelled, spell_expr
from tessera_rw.algebra.ops.strided import piece_shapes, piece_views
from tessera_rw.codegen.kernel_op import KernelOp


@dataclass(frozen=True)
class Piece:
    op: KernelOp                    # the piece as a strided_elementwise over the operands it reads
    operands: tuple[int, ...]       # which of the whole op's operands those are
    start: int                      # where the piece starts along the concatenated axis


@functools.lru_cache(maxsize=256)
def pieces(op: KernelOp) -> tuple[Piece, ...]:
    """The pieces of a concatenated_elementwise, in order along its axis (parsed once per op: the
    template asks for them in every schedule check, costing and emission)."""
    a = op.attr_map
    shape, axis, sizes = op.result.shape, a["axis"], tuple(a["sizes"])
    found, start = [], 0
    for expr, piece_shape, views in zip(a["exprs"].split(";"), piece_shapes(shape, axis, sizes),
                                        piece_views(len(op.operands), shape, axis, sizes, a["strides"], a["offsets"])):
        tree = parse_expr(expr)
        used = tuple(sorted(expr_leaves(tree)))
        renumbered = respelled(tree, lambda i: used.index(i))
        strided = KernelOp.of("strided_elementwise", tuple(op.operands[i] for i in used),
                              TensorType(piece_shape, op.result.dtype), numerics=op.numerics,
                              expr=spell_expr(renumbered), shape=piece_shape,
                              strides=tuple(s for i in used for s in views[i][0]),
                              offsets=tuple(views[i][1] for i in used))
        found.append(Piece(strided, used, start))
        start += piece_shape[axis]
    return tuple(found)
