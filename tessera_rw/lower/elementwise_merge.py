"""Elementwise kernels of an extracted program merged where only one reads the other.

The e-graph's fusion rules give a fused node at most MAX_FUSED_INPUTS inputs, and a scalar constant
or a tensor read twice each takes one: the derivative of gelu reads x in five places and holds four
constants, so extraction leaves it as several kernels, each writing a tensor the next one reads back.
(Bounding the inputs is what keeps the e-graph small: every way of cutting a chain into kernels is a
node of it.) Once a program is chosen, each fused_elementwise node takes its scalar constants into
its expression ('mul($0,$1)' of x and 0.5 becomes 'mul($0,0.5:float32)' of x), reads each tensor
once, and absorbs the elementwise producers of its own shape that nothing else reads, up to
MERGED_INPUTS distinct tensors and MAX_FUSED_OPS ops (and those that only spread far smaller inputs
over their result, a mask from class indices, whatever reads them: each reader computes them
again; and those several kernels read, by each reader that reads what it is computed from
already, or by every reader where each may compute it and it is at most CHEAP_OPS ops: a batch
norm's x̂ = (x − μ)/σ, read by three kernels, is computed by each from x, the per-channel μ and σ
staying in cache, and none writes it. A value the caller reads too is rounded to its 16-bit dtype
where it is computed again; others compute wide, as any fused chain does; an 8-bit float is read,
never computed again). A single elementwise op, and a plain sum / mean / max / min, takes its
producers in too, becoming a fused node, and a spread leaf (broadcast_to) is read as the smaller
value it spreads, in place; a producer read through a reshape is taken in over its operands
reshaped (lower/expression_spelling.py). Merging repeats while it changes the program: once the
other readers compute a value again, the last reads it alone and takes it in. Last, each tiny value
(at most TINY bytes: a per-channel scale, a per-row weight, a scalar) is computed again by every
kernel that spreads it far wider, and its own kernel is gone. It computes what the kernels it
replaces did (in one pass, keeping the intermediates in registers, as every fused node does), so
the cost model prices the program after it, and the plan runs it.

>>> from tessera_rw.algebra.builder import make, make_constant, make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> x = make_input("x", (4, 8), DType.float32)
>>> half = make("fused_elementwise", x, make_constant(0.5, DType.float32), expr="mul($0,$1)")
>>> y = make("fused_elementwise", half, x, expr="add(exp($0),$1)")
>>> [(n.op, n.attr_map.get("expr")) for n in merge_elementwise(Graph("g", (x,), (y,))).nodes if n.op != "input"]
[('fused_elementwise', 'add(exp(mul($0,0.5:float32)),$0)')]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tessera_rw.algebra.builder import make
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node, TensorType
from tessera_rw.algebra.ops.fused_expr import (MAX_FUSED_OPS, Scalar, count_ops, expression_name, parse_expr,
                                                respelled, spell_expr)
from tessera_rw.lower.expression_spelling import (EXPANSION, Spelling, TooBig, expression_tree, is_elementwise,
                                                  reads_reshaped, spreads_to, values_of)

MERGED_INPUTS = 8       # distinct tensors one merged kernel reads (each a pointer and a load per element)
MERGE_ROUNDS = 3        # passes over a program, each taking in what the last left with one reader
CHEAP_READ = 1 << 18    # bytes a kernel reads in less time than a launch takes: a small value computed again
CHEAP_OPS = 16          # ops of a value each of its readers computes again, reading its operands instead
TINY = 1 << 14          # bytes of a value (per channel, per row) every reader computes again, however many there are


def is_expansion(node: Node) -> bool:
    """Whether `node` spreads far smaller inputs over its result (a class mask from the indices and
    positions, a per-row value over the row): each reader computes it again from those inputs, which
    stay in cache, rather than read it back from memory."""
    read = sum(a.type.numel for a in node.args if Scalar.of(a) is None)
    return node.type.numel >= EXPANSION * max(read, 1)


def merge_elementwise(graph: Graph) -> Graph:
    """`graph` with each fused_elementwise and fused_reduction node's constants in its expression,
    each tensor it reads read once, its single-reader elementwise producers of its expression's shape
    absorbed, and the producers several read computed again by those for which that reads no more.
    Again while that changes the program: a value every other reader now computes is one the last
    reads alone. Then, what is written settled, each tiny value is computed again by the kernels
    that spread it (its kernel gone once all do)."""
    for _ in range(MERGE_ROUNDS):
        merged = _merged_once(graph, tiny=False)
        if merged is graph:
            break
        graph = merged
    return _merged_once(graph, tiny=True)


def _merged_once(graph: Graph, tiny: bool) -> Graph:
    users, outputs = graph.users, set(graph.outputs)
    new: dict[Node, Node] = {}
    absorbable: set[Node] = set()       # new nodes whose one reader may take them in
    alone: set[Node] = set()            # ...of them, those no other kernel reads spread out again
    shared: set[Node] = set()           # new nodes several kernels read (or the caller too)
    producers = _Producers(absorbable, alone, shared, set(), set(), set(), set())
    for node in graph.nodes:
        rebuilt = node.replace(args=tuple(new[a] for a in node.args))     # node itself where they are its own
        if node.op in ("fused_elementwise", "fused_reduction"):
            new[node] = _merged(node, rebuilt, producers)
        elif (spelled := _one_op_expression(node) or _as_fused_reduction(node)) is not None:
            merged = _merged(spelled, spelled.replace(args=rebuilt.args), producers)
            # the op alone is its own kernel unless it took producers in or holds a constant its
            # dtype does not (it then computes with the value itself, rounding as it did)
            kept = merged.args == rebuilt.args and not _inexact(node.args)
            new[node] = rebuilt if kept else merged
        else:
            new[node] = rebuilt
        if _reshapes_alone(node, new[node], users, outputs, absorbable):
            producers.reshaped.add(new[node])
        if not is_elementwise(new[node]):
            continue
        if tiny and node not in outputs and new[node].type.nbytes <= TINY and not _fp8(new[node].type):
            producers.tiny.add(new[node])
        spread = is_expansion(new[node])
        if (len(users[node]) == 1 or spread) and node not in outputs:
            absorbable.add(new[node])
            if not spread:
                alone.add(new[node])
        else:
            shared.add(new[node])
            if node in outputs:
                producers.returned.add(new[node])
            elif all(_takes_in(user, node) for user in users[node]):
                producers.dissolving.add(new[node])
    if all(new[n] is n for n in graph.nodes):
        return graph
    return Graph(graph.name, graph.inputs, tuple(new[o] for o in graph.outputs)).verify()


def _reshapes_alone(node: Node, rebuilt: Node, users, outputs: set[Node], absorbable: set[Node]) -> bool:
    """Whether `node` is a reshape that one kernel reads of a producer it alone reads, every
    operand of which spans each run of axes the reshape regroups whole or not at all (a
    per-channel scale does, under windows of the plane): its reader computes the producer over the
    operands reshaped to match (views), as a mean over windows of relu(x·s + b) reads x, s and b."""
    if node.op != "reshape" or len(users[node]) != 1 or node in outputs or rebuilt.args[0] not in absorbable:
        return False
    return reads_reshaped(rebuilt.args[0], node.shape)


def _takes_in(user: Node, value: Node) -> bool:
    """Whether `user` is a kernel that may compute `value` again: an elementwise one, or a reduction
    of an expression, over values of its shape."""
    if user.op == "fused_reduction":
        return values_of(user).shape == value.shape
    return is_elementwise(user) and user.shape == value.shape


def _inexact(args: tuple[Node, ...]) -> bool:
    """Whether a scalar constant among `args` is one its 16- or 8-bit dtype does not hold (70000 in
    float16): an expression computes with the value itself, as the reference does, where a constant
    buffer of that dtype would hold it rounded."""
    for arg in args:
        scalar = Scalar.of(arg)
        if scalar is not None and scalar.dtype.is_low_precision:
            with np.errstate(over="ignore", under="ignore"):
                held = float(np.asarray(scalar.value, dtype=np.float64).astype(scalar.dtype.numpy))
            if held != scalar.value and not (math.isnan(held) and math.isnan(scalar.value)):
                return True
    return False


def _one_op_expression(node: Node) -> Node | None:
    """An elementwise op as the one-op fused_elementwise of it (to take producers or a constant
    into); None for any other node."""
    name = expression_name(node.op, node.attr_map)
    if name is None or any(t.dtype.is_complex or _fp8(t) for t in (node.type, *(a.type for a in node.args))):
        return None             # complex values: no fused kernel computes them; fp8: see _fp8
    try:
        operands = ",".join(f"${i}" for i in range(len(node.args)))
        spelled = make("fused_elementwise", *node.args, expr=f"{name}({operands})")
    except TesseraError:        # an op an expression cannot spell over these types: it keeps its kernel
        return None
    return spelled if spelled.type == node.type else None


def _fp8(t: TensorType) -> bool:
    """Whether `t` is an 8-bit float, whose rounding where a kernel writes it (448 is e4m3's largest:
    65504 stored is NaN) no expression spells: a producer of one is read, never computed again."""
    return t.dtype.is_float and t.dtype.itemsize == 1


def _as_fused_reduction(node: Node) -> Node | None:
    """A plain sum, mean, max or min as the fused_reduction of its operand (to take its producer
    in); None for any other node."""
    if node.op not in ("sum", "mean", "max", "min") or not node.args[0].type.dtype.is_float or _fp8(node.args[0].type):
        return None
    a = node.attr_map
    try:
        spelled = make("fused_reduction", node.args[0], expr="$0", reduce=node.op, axes=a["axes"],
                       keepdims=a["keepdims"])
    except TesseraError:
        return None
    return spelled if spelled.type == node.type else None


@dataclass(frozen=True)
class _Producers:
    """The elementwise nodes a kernel may take in, by how many kernels read them."""
    absorbable: set[Node]       # read by that kernel alone, or spreading far smaller inputs
    alone: set[Node]            # ...of them, those no other kernel reads
    shared: set[Node]           # read by several kernels (or returned): each may compute them again
    returned: set[Node]         # ...of them, those the caller reads too: rounded to their dtype when computed again
    dissolving: set[Node]       # ...of them, those every reader may compute (none is left to write them)
    reshaped: set[Node]         # reshapes of absorbable producers over operands of their shape, read by one kernel
    tiny: set[Node]             # values of at most TINY bytes (per channel, per row, scalars), which readers compute


def _merged(node: Node, rebuilt: Node, producers: _Producers) -> Node:
    """The node computing `rebuilt` (`node` over the merged program's values) with what it can take
    in; without producers where taking them in would read too many tensors or nest too many ops. A
    fused_reduction takes in what the expression it reduces reads, at the shape of its values."""
    shape = node.shape if node.op == "fused_elementwise" else values_of(node).shape
    tree = parse_expr(node.attr_map["expr"])
    recomputed = _recomputed(tree, rebuilt.args, producers, shape)
    # every producer it may take in, with the shared ones it reads no more to compute; every one it
    # may take in; those it alone reads (a spread value others read too costs them little to compute
    # again); none. Each with the tiny values it reads computed again too, then without them
    absorbable, returned, tiny = producers.absorbable, frozenset(producers.returned), producers.tiny
    tiers = ((absorbable, recomputed, tiny), (absorbable, recomputed, set()), (absorbable, frozenset(), tiny),
             (absorbable, frozenset(), set()), (producers.alone, frozenset(), set()), (set(), frozenset(), set()))
    for last, (taken, again, small) in enumerate(tiers, 1 - len(tiers)):
        spelling = Spelling(taken, shape, [], again, returned, None if not last else MAX_FUSED_OPS,
                             producers.reshaped, small)
        try:
            spelled = spelling.of(tree, rebuilt.args)
        except TooBig:
            continue
        leaves, ops = spelling.leaves, count_ops(spelled)
        if len(leaves) <= MERGED_INPUTS and ops <= MAX_FUSED_OPS:
            break
    spelled, leaves = _unspread(spelled, leaves, shape)
    expr = spell_expr(spelled)
    if tuple(leaves) == rebuilt.args and expr == node.attr_map["expr"]:
        return rebuilt
    if node.op == "fused_elementwise" and ops < 2 and not _inexact(rebuilt.args):
        return rebuilt          # a one-op node is that op's kernel: its constant is not worth a new one
    try:
        merged = make(node.op, *leaves, **(node.attr_map | {"expr": expr}))
    except TesseraError:        # an expression over other types than the kernels it replaces: keep them
        return rebuilt
    return merged if merged.type == node.type else rebuilt


def _unspread(tree, leaves: list[Node], shape: tuple[int, ...]):
    """(`tree`, `leaves`) with each leaf that broadcasts a smaller value to `shape` as numpy would
    replaced by that value, which the kernel reads in place (once, where several leaves spread it),
    as long as the leaves still reach `shape`; else as they were."""
    unspread = [leaf.args[0] if leaf.op == "broadcast_to" and spreads_to(leaf.args[0].shape, shape) else leaf
                for leaf in leaves]
    if unspread == leaves or np.broadcast_shapes(*(leaf.shape for leaf in unspread)) != shape:
        return tree, leaves
    distinct = list(dict.fromkeys(unspread))
    return respelled(tree, lambda i: distinct.index(unspread[i])), distinct


def _recomputed(tree, args: tuple[Node, ...], producers: _Producers, shape: tuple[int, ...]) -> frozenset[Node]:
    """The shared producers a kernel computing `tree` over `args` computes again rather than reads:
    one at a time, the one adding fewest bytes to what it reads, while that is no more than the
    bytes of the value itself (a normalized x read by three kernels: each reads x instead, and
    nothing writes it), or than CHEAP_READ (a loss's mask of rows kept, from the targets). Whether
    other kernels still read the value or not, none reads more (or more than a launch's worth)."""
    chosen: frozenset[Node] = frozenset()
    rejected: set[Node] = set()         # those whose expression would nest too many ops
    latest = None
    while True:
        spelling = Spelling(producers.absorbable, shape, [], chosen, frozenset(), MAX_FUSED_OPS, producers.reshaped,
                             set())
        try:
            spelling.of(tree, args)
        except TooBig:
            if latest is None:
                return chosen
            chosen -= {latest}
            rejected.add(latest)
            latest = None
            continue
        leaves = spelling.leaves
        read = set(leaves)
        added = {leaf: sum(_in_memory(a).nbytes for a in _streamed(leaf) if a not in read)
                 for leaf in leaves
                 if leaf in producers.shared and leaf.shape == shape and leaf not in rejected and not _fp8(leaf.type)}
        fits = [leaf for leaf, more in added.items() if more <= _allowance(leaf, producers)]
        if not fits:
            return chosen
        latest = min(fits, key=lambda leaf: (added[leaf], leaves.index(leaf)))
        chosen |= {latest}


def _allowance(value: Node, producers: _Producers) -> int:
    """The bytes a kernel may read beyond what it reads to compute `value` again: its own where
    every reader may compute it (reading its operands instead of it then reads no more in all) and
    it is a few ops (a chain of values each read twice nests many: the next kernels would rather
    read them), or CHEAP_READ (less than a launch costs); none where it is written anyway."""
    few = count_ops(expression_tree(value)) <= CHEAP_OPS
    return max(value.type.nbytes if value in producers.dissolving and few else 0, CHEAP_READ)


def _streamed(node: Node) -> list[Node]:
    """The tensors computing `node` streams from memory: not constants, nor values far smaller than
    it (a per-channel scale stays in cache, whichever kernel reads it)."""
    return [a for a in node.args if Scalar.of(a) is None and _in_memory(a).numel * EXPANSION > node.type.numel]


def _in_memory(value: Node) -> TensorType:
    """What reading `value` reads: a broadcast value's operand (read in place, spread by strides)."""
    while value.op == "broadcast_to":
        value = value.args[0]
    return value.type
