"""Candidate extraction: from a saturated e-graph, the cheapest program at each fusion depth.

Each e-node is one kernel (views and inputs launch none) whose cost is the cost model's time. At
each depth — unfused, epilogue-fused, fully fused — only the e-nodes of that depth or below may be
chosen; the cheapest tree under that restriction comes first (exact when nothing is shared, and
safe with cycles), then a DAG pass re-chooses e-nodes whose operands are already paid for elsewhere,
scoring every change by the cost of the whole program (a shared subexpression is paid once:
`dag_sharing`). Each program's layout chains are folded and its elementwise kernels merged where
only one reads the other (lower's passes) before it is costed. Programs that come out alike at two
depths are kept once. A depth whose fused ops the e-graph holds but no cheapest program takes (a
plugin's SIMT kernel losing to tensor cores) still gets a candidate that takes them, so the report
weighs it in the open. Everything is deterministic: ties keep the e-node the e-graph listed first.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Iterator

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.algebra.ops import BUILTIN_OPS
from tessera_rw.algebra.ops.fused_expr import read_once
from tessera_rw.algebra.ops.fused_norm import lifts_nothing
from tessera_rw.lower.attention_views import read_attention_views
from tessera_rw.lower.conv_bias_grads import sum_bias_grads_in_weight_grads
from tessera_rw.lower.conv_views import read_conv_views_in_place
from tessera_rw.lower.concat_reads import read_concatenates_in_place
from tessera_rw.lower.centered_sums import without_centered_terms
from tessera_rw.lower.elementwise_merge import merge_elementwise
from tessera_rw.lower.epilogue_merge import merge_epilogues
from tessera_rw.lower.kept_preactivations import keep_preactivations
from tessera_rw.lower.layout_chains import fold_layout_chains
from tessera_rw.lower.output_groups import computed_together
from tessera_rw.lower.reduction_groups import reduced_together
from tessera_rw.lower.view_reads import read_views_in_place
from tessera_rw.codegen.arch import ArchSpec
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw.codegen.templates.registry import templates_for
from tessera_rw.rules.choice import cheapest_choice
from tessera_rw.rules.egraph import EGraphView, ENode
from tessera_rw.rules.saturate import RewriteResult
from tessera_rw.support.collector import with_collector_paused
from tessera_rw.tune.cost import KernelCost, kernel_cost
from tessera_rw.tune.dag_sharing import VIEW_COST, share_more

# What extraction adds for a kernel no GPU template implements (its streaming estimate is what the
# reports show): a form the templates take (a transposed softmax, a vector as a one-row matrix)
# wins over it whatever its copies cost, and among host-only plans the one with fewest such kernels.
HOST_ONLY_US = 1e6

READ_ONCE_OPS = ("fused_elementwise", "fused_reduction")    # lowering merges their repeated operands


class Objective(enum.Enum):
    """What extraction minimizes: the cost model's time (the default), or FLOPs alone."""
    TIME = "time"
    FLOPS = "flops"


class FusionDepth(enum.IntEnum):
    """How much a program fuses; a candidate is labelled by its deepest fused op."""
    UNFUSED = 0
    EPILOGUE = 1        # GEMM epilogues, elementwise chains, normalizations with their neighbours
    FULL = 2            # whole subgraphs as one kernel: flash attention, plugin fusions

    @property
    def label(self) -> str:
        return {0: "unfused", 1: "epilogue-fused", 2: "fully fused"}[self.value]


FUSED_OP_DEPTH = {"gemm": FusionDepth.EPILOGUE, "gemm_pre_act": FusionDepth.EPILOGUE,
                  "gated_gemm": FusionDepth.EPILOGUE, "matmul_bias_grad": FusionDepth.EPILOGUE,
                  "fused_elementwise": FusionDepth.EPILOGUE, "strided_elementwise": FusionDepth.EPILOGUE,
                  "fused_conv": FusionDepth.EPILOGUE,
                  "concatenated_elementwise": FusionDepth.EPILOGUE, "multi_elementwise": FusionDepth.EPILOGUE,
                  "multi_reduction": FusionDepth.EPILOGUE,
                  "strided_normalization": FusionDepth.EPILOGUE,
                  "fused_normalization": FusionDepth.EPILOGUE, "reduced_normalization": FusionDepth.EPILOGUE,
                  "norm_backward": FusionDepth.EPILOGUE,
                  "norm_backward_stats": FusionDepth.EPILOGUE, "norm_backward_grads": FusionDepth.EPILOGUE,
                  "flash_attention": FusionDepth.FULL, "strided_attention": FusionDepth.FULL,
                  "flash_attention_lse": FusionDepth.FULL, "attention_row_stats": FusionDepth.FULL,
                  "attention_row_stats_from_lse": FusionDepth.FULL,
                  "flash_attention_bwd": FusionDepth.FULL, "strided_attention_lse": FusionDepth.FULL,
                  "strided_attention_row_stats_from_lse": FusionDepth.FULL, "strided_attention_bwd": FusionDepth.FULL}


def fusion_depth(op: str) -> FusionDepth:
    """The depth of one op: built-in plain ops are unfused; a plugin's op is a fusion of its own."""
    if op in FUSED_OP_DEPTH:
        return FUSED_OP_DEPTH[op]
    return FusionDepth.UNFUSED if op in BUILTIN_OPS else FusionDepth.FULL


@dataclass(frozen=True)
class Candidate:
    """One program the e-graph holds, with its kernels' costs in execution order."""
    fusion_depth: FusionDepth
    graph: Graph
    kernels: tuple[KernelCost, ...]

    @property
    def hbm_bytes(self) -> int:
        return sum(k.hbm_bytes for k in self.kernels)

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def est_us(self) -> float:
        return sum(k.est_us for k in self.kernels)


def depth_of(graph: Graph) -> FusionDepth:
    """A program's fusion depth: its deepest op's."""
    return max((fusion_depth(node.op) for node in graph.nodes), default=FusionDepth.UNFUSED)


def candidate_of(graph: Graph, arch: ArchSpec, depth: FusionDepth | None = None) -> Candidate:
    """A program as it stands, costed kernel by kernel under the numerics policy in force; its
    fusion depth is its ops' deepest unless given (that of the program it was lowered from)."""
    kernels = []
    numerics = current_numerics()
    if depth is None:
        depth = depth_of(graph)
    for node in graph.nodes:
        cost = kernel_cost(KernelOp.from_node(node, numerics), arch, fused_op=fusion_depth(node.op) > 0)
        if cost is not None:
            kernels.append(cost)
    return Candidate(depth, graph, tuple(kernels))


class _Costs:
    """Per-e-node cost (µs, or FLOPs) under a depth limit, from the e-graph's own types, under the
    numerics policy in force when extraction starts (a `fast` fp32 product is costed in tf32)."""

    def __init__(self, view: EGraphView, arch: ArchSpec, objective: Objective):
        self.view, self.arch, self.objective = view, arch, objective
        self.numerics = current_numerics()
        self.types = view.types
        self._memo: dict[str, float] = {}

    def __call__(self, enode: ENode) -> float:
        cost = self._memo.get(enode.id)
        if cost is None and lifts_nothing(enode.op, enode.attrs):
            cost = self._memo[enode.id] = math.inf        # the plain norm beside it is the same kernel
        if cost is None:
            operands, attrs = enode.operands, enode.attrs
            if enode.op in READ_ONCE_OPS:         # a tensor read in two places: lowering reads it once
                operands, expr = read_once(operands, dict(attrs)["expr"])
                attrs = tuple((k, expr if k == "expr" else v) for k, v in attrs)
            op = KernelOp(enode.op, tuple(self.types[c] for c in operands), attrs, self.types[enode.eclass],
                          self.numerics)
            kc = kernel_cost(op, self.arch, fused_op=fusion_depth(enode.op) > 0)
            if kc is None:
                cost = VIEW_COST
            elif self.objective is Objective.FLOPS:
                cost = kc.flops + VIEW_COST if math.isfinite(kc.est_us) else math.inf
            else:
                cost = kc.est_us + (0.0 if kc.has_template else HOST_ONLY_US)
            self._memo[enode.id] = cost
        return cost

    def limited(self, depth: FusionDepth, forbid: frozenset[str]) -> Callable[[ENode], float]:
        return lambda enode: self(enode) if fusion_depth(enode.op) <= depth and enode.op not in forbid else math.inf


@dataclass(frozen=True)
class DepthChoice:
    """The program extraction chose at one fusion depth: an e-node per class (the classes the
    roots reach are the program) and the per-e-node cost it was chosen under (inf for e-nodes
    deeper than `depth` or forbidden)."""
    depth: FusionDepth
    choice: dict[str, ENode]
    cost: Callable[[ENode], float]


def choose_per_depth(result: RewriteResult, arch: ArchSpec, objective: Objective = Objective.TIME,
                     forbid: frozenset[str] = frozenset()) -> tuple[DepthChoice, ...]:
    """The cheapest program at each fusion depth the e-graph can express its outputs at."""
    view, roots = result.view, result.output_classes()
    if missing := [r for r in roots if r not in view.classes]:
        raise TesseraError(f"graph {result.graph.name!r}: output e-class(es) {', '.join(missing)} are missing from "
                           "the e-graph's view (a constructor it could not read back)",
                           hint="report this with the kernel; TESSERA_DISABLE_PLUGINS=1 rules out a plugin's ops")
    costs = _Costs(view, arch, objective)
    chosen = []
    for depth in FusionDepth:
        limited = costs.limited(depth, frozenset(forbid))
        tree = cheapest_choice(view, limited)
        if any(r not in tree for r in roots):
            continue  # the program needs fused ops deeper than this
        chosen.append(DepthChoice(depth, share_more(view, tree, roots, limited), limited))
    return tuple(chosen)


@with_collector_paused
def extract_candidates(result: RewriteResult, arch: ArchSpec, k: int = 3, objective: Objective = Objective.TIME,
                       forbid: frozenset[str] = frozenset()) -> tuple[Candidate, ...]:
    """Up to `k` programs of distinct fusion depths from a saturated e-graph, cheapest first.
    Ops in `forbid` are never chosen (e.g. {"rfft"} for the best program without the FFT path)."""
    found: list[Candidate] = []
    for candidate in _per_depth(result, arch, objective, forbid):
        if all(_launches(candidate) != _launches(c) for c in found):   # a gemm fusing nothing: no new one
            found.append(candidate)
    if not found:   # no program of finite cost: an op as written has no GPU template; it still runs on the host
        return (candidate_of(result.graph, arch),)
    for candidate, fits in _alternatives(result, arch, objective, forbid, tuple(found)):
        if candidate and fits(candidate) and all(_launches(candidate) != _launches(c) for c in found):
            found.append(candidate)
    ranked = sorted(found, key=lambda c: (_primary(c, objective), len(c.kernels), c.fusion_depth))
    return tuple(ranked[:k])


def _primary(c: Candidate, objective: Objective) -> float:
    return c.est_us if objective is Objective.TIME else c.flops


def _per_depth(result: RewriteResult, arch: ArchSpec, objective: Objective,
               forbid: frozenset[str]) -> list[Candidate]:
    """The cheapest program at each fusion depth (choose_per_depth), each costed once (a program
    that two depths chose alike, once)."""
    programs = {}
    for chosen in choose_per_depth(result, arch, objective, forbid):
        program = _decoded(result, chosen.choice)
        programs.setdefault(program.outputs, program)
    return [_candidate(program, arch) for program in programs.values()]


def _candidate(program: Graph | None, arch: ArchSpec) -> Candidate | None:
    if program is None:
        return None
    lowered = keep_preactivations(merge_epilogues(merge_elementwise(fold_layout_chains(program)), _still_a_kernel))
    lowered = read_conv_views_in_place(read_attention_views(read_views_in_place(lowered)))
    lowered = read_concatenates_in_place(sum_bias_grads_in_weight_grads(lowered))
    lowered = computed_together(reduced_together(without_centered_terms(lowered)))
    # reading views in place is lowering: a program's fusion depth is that of the ops it was chosen with
    return candidate_of(lowered, arch, depth_of(program))


def _still_a_kernel(host: Node, merged: Node) -> bool:
    """Whether a kernel that takes an epilogue merge in is one a GPU template takes where `host` was
    (a float64 input computed in a row kernel's epilogue is one its template cannot read)."""
    return not templates_for(KernelOp.from_node(host)) or bool(templates_for(KernelOp.from_node(merged)))


SPECTRAL_OPS = frozenset({"rfft", "irfft", "fft", "ifft"})
DIRECT_CONV_OPS = frozenset({"conv1d", "conv2d", "fused_conv"})


def _alternatives(result: RewriteResult, arch: ArchSpec, objective: Objective, forbid: frozenset[str],
                  found: tuple[Candidate, ...]) -> Iterator[tuple[Candidate | None, Callable[[Candidate], bool]]]:
    """Programs the cheapest per depth leave out but a reader weighs: for each fusion depth the
    e-graph holds e-nodes of that no cheapest program reached (a plugin's SIMT kernel losing to
    tensor cores; a normalization lifted to fuse nothing does not count: extraction never takes it),
    the program taking them; where the e-graph holds a convolution both direct and
    through the FFT, the cheapest program of each form. Each with what a candidate made of it must
    be to count."""
    view = result.view
    held = {e.op for enodes in view.classes.values() for e in enodes if not lifts_nothing(e.op, e.attrs)}
    reached = {c.fusion_depth for c in found}
    for depth in sorted({fusion_depth(op) for op in held} - reached):
        if depth > max(reached):
            yield _candidate(_favouring(result, arch, depth, objective, forbid), arch), \
                lambda c, d=depth: c.fusion_depth == d
    if held & SPECTRAL_OPS and held & DIRECT_CONV_OPS:
        for without in (SPECTRAL_OPS, DIRECT_CONV_OPS):
            cheapest = min(_per_depth(result, arch, objective, forbid | without),
                           key=lambda c: _primary(c, objective), default=None)
            yield cheapest, lambda c: True


def _decoded(result: RewriteResult, choice: dict[str, ENode]) -> Graph:
    view, roots = result.view, result.output_classes()
    return Graph(result.graph.name, result.graph.inputs, view.decode_all(choice, roots)).verify()


def _favouring(result: RewriteResult, arch: ArchSpec, depth: FusionDepth, objective: Objective,
               forbid: frozenset[str]) -> Graph | None:
    """The program that takes the e-nodes of `depth` wherever a template implements them (they cost
    next to nothing while choosing), the rest at the cost model's price; None when none applies."""
    view, roots = result.view, result.output_classes()
    limited = _Costs(view, arch, objective).limited(depth, forbid)

    def favoured(enode: ENode) -> float:
        cost = limited(enode)
        return VIEW_COST if fusion_depth(enode.op) == depth and cost < HOST_ONLY_US else cost
    tree = cheapest_choice(view, favoured)
    if any(r not in tree for r in roots):
        return None
    return _decoded(result, share_more(view, tree, roots, favoured))


def _launches(c: Candidate) -> tuple:
    """What a candidate runs: each kernel's kind, fusions, bytes and FLOPs (an elementwise chain of
    one op is that op's kernel)."""
    return tuple((k.kind, () if k.kind == "elementwise" and len(k.fused) < 2 else k.fused, k.hbm_bytes, k.flops)
                 for k in c.kernels)
