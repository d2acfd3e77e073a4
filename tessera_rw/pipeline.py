"""From a traced Graph to the plan that runs: rewrite, extract candidates, choose, lower.

One function so that calling a kernel, explaining it and tuning it all see the same program.

>>> from tessera_rw import op
>>> @op.kernel
... def f(x):
...     return op.softmax(x * 2.0, axis=-1)
>>> program = compile_program(f.trace(op.tensor((64, 128), "float32")))
>>> [step.op for step in program.plan.steps]   # the scale folds into the softmax kernel
['fused_normalization']
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen.arch import ArchSpec, target_arch
from tessera_rw.lower.lowering import lower
from tessera_rw.lower.plan import KernelPlan
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import RewriteResult, rewrite
from tessera_rw.tune.extract import Candidate, extract_candidates


@dataclass(frozen=True)
class CompiledProgram:
    """A graph's rewrite, its candidates (cheapest first), the one chosen and its plan."""
    graph: Graph
    arch: ArchSpec
    rewrite: RewriteResult
    candidates: tuple[Candidate, ...]
    chosen: int
    chosen_by: str              # "cost_model" | "on_device" | "cache"
    plan: KernelPlan

    @property
    def candidate(self) -> Candidate:
        return self.candidates[self.chosen]


def compile_program(graph: Graph, arch: ArchSpec | None = None) -> CompiledProgram:
    """Saturate `graph`, extract candidates for `arch` and lower the cost model's choice."""
    arch = arch or target_arch()
    graph = graph.verify()
    result = rewrite(graph, rulesets())
    candidates = extract_candidates(result, arch)
    return CompiledProgram(graph, arch, result, candidates, 0, "cost_model", lower(candidates[0].graph))
