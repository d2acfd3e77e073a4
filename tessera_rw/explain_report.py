"""ExplainReport: what tessera_rw did with one function, as data (`tessera_rw.explain/1`).

The report is the fusion trace users read to trust the compiler: the inputs, how the e-graph
grew and why it stopped, which rules fired, every candidate the cost model weighed with its
kernels, and which one was chosen and by what (the cost model, timing on the GPU, or the cache).
`print(report)` gives the text (rich tables at 100 columns); `report.to_json()` gives exactly the
schema below, and `ExplainReport.from_json` validates a document against it.

    {"schema", "function", "inputs": [{"name", "shape", "dtype"}],
     "egraph": {"iterations", "enodes", "eclasses", "seconds", "stop_reason"},
     "rules": [{"name", "ruleset", "matches"}],
     "candidates": [{"fusion_depth", "hbm_bytes", "flops", "est_us",
                     "kernels": [{"kind", "fused", "hbm_bytes", "flops", "registers", "smem_bytes", "est_us"}]}],
     "chosen": <index into candidates>, "chosen_by": "cost_model" | "on_device" | "cache"}

`fusion_depth` is 0 (unfused), 1 (epilogue-fused) or 2 (fully fused). A kernel's figures are the
cost model's: for a plain op no GPU template implements (a float64 product: the plan runs it on
the host) they are those of a streaming kernel over its operands and result, its registers that
estimate's assumption; for a library call (cuFFT) registers and shared memory are typical values,
not the library's. `est_us` is null where no estimate exists: a fused op no template implements
(its time is unknown, not infinite).

>>> from tessera_rw import op
>>> @op.kernel
... def f(x):
...     return op.softmax(x * 2.0, axis=-1)
>>> report = f.explain(op.tensor((64, 128), "float32"))
>>> report.candidates[report.chosen].kernels[0].kind, report.chosen_by
('softmax', 'cost_model')
>>> ExplainReport.from_json(report.to_json()) == report
True
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tessera_rw.algebra.errors import TesseraError

from tessera_rw.pipeline import CompiledProgram
from tessera_rw.text_console import TEXT_WIDTH
from tessera_rw.tune.cost import KernelCost
from tessera_rw.tune.extract import Candidate

SCHEMA = "tessera_rw.explain/1"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputInfo(_Record):
    name: str
    shape: tuple[int, ...]
    dtype: str


class EGraphInfo(_Record):
    iterations: int = Field(ge=0)
    enodes: int = Field(ge=0)
    eclasses: int = Field(ge=0)
    seconds: float = Field(ge=0)
    stop_reason: Literal["saturated", "iteration_limit", "node_limit", "time_limit"]


class RuleInfo(_Record):
    name: str
    ruleset: str
    matches: int = Field(ge=0)


class KernelInfo(_Record):
    kind: str
    fused: tuple[str, ...]
    hbm_bytes: int = Field(ge=0)
    flops: int = Field(ge=0)
    registers: int = Field(ge=0)
    smem_bytes: int = Field(ge=0)
    est_us: float | None = Field(ge=0)


class CandidateInfo(_Record):
    fusion_depth: int = Field(ge=0, le=2)
    hbm_bytes: int = Field(ge=0)
    flops: int = Field(ge=0)
    est_us: float | None = Field(ge=0)
    kernels: tuple[KernelInfo, ...]


class ExplainReport(_Record):
    schema_: Literal["tessera_rw.explain/1"] = Field(SCHEMA, alias="schema")
    function: str
    inputs: tuple[InputInfo, ...]
    egraph: EGraphInfo
    rules: tuple[RuleInfo, ...]
    candidates: tuple[CandidateInfo, ...] = Field(min_length=1)
    chosen: int = Field(ge=0)
    chosen_by: Literal["cost_model", "on_device", "cache"]
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # what the text shows beyond the schema (the graphs, schedules, the plan); absent when parsed from JSON
    _program: CompiledProgram | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _chosen_is_a_candidate(self) -> ExplainReport:
        if self.chosen >= len(self.candidates):
            raise ValueError(f"chosen={self.chosen} but there are {len(self.candidates)} candidates")
        return self

    @property
    def program(self) -> CompiledProgram | None:
        """The compiled program the report describes (None for a report read from JSON)."""
        return self._program

    def __eq__(self, other: object) -> bool:      # the data, not the program it was made from
        return isinstance(other, ExplainReport) and self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(self.to_json(indent=None))

    def to_json(self, indent: int | None = 2) -> str:
        """The report as one `tessera_rw.explain/1` JSON document, as text (to_dict(): as dicts)."""
        return self.model_dump_json(by_alias=True, indent=indent)

    def to_dict(self) -> dict:
        """The report's `tessera_rw.explain/1` document as `json.loads(report.to_json())` reads it."""
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_json(cls, document: str | bytes | dict) -> ExplainReport:
        """One report from its JSON text or the dict `json.load` gives; a document that is not one
        (a wrong schema, a missing field, a list) raises ReportError saying what is wrong."""
        data = _parsed(document)
        if isinstance(data, list):
            raise ReportError(f"the document is a list of {len(data)} reports (what --format json writes for "
                              "several functions)", hint="read it with ExplainReport.all_from_json")
        return _validated(cls, data)

    @classmethod
    def all_from_json(cls, document: str | bytes | dict | list) -> tuple[ExplainReport, ...]:
        """Every report of a document: a list of them, or one."""
        data = _parsed(document)
        return tuple(_validated(cls, item) for item in (data if isinstance(data, list) else [data]))

    def render(self, width: int = TEXT_WIDTH) -> str:
        """The text form (rich tables, no colour) at `width` columns."""
        from tessera_rw.report import Printable, explain_renderables
        return Printable(*explain_renderables(self)).text(width)

    def __str__(self) -> str:
        return self.render()


def _us(t: float) -> float | None:
    return t if math.isfinite(t) else None


def kernel_info(k: KernelCost) -> KernelInfo:
    return KernelInfo(kind=k.kind, fused=k.fused, hbm_bytes=k.hbm_bytes, flops=k.flops, registers=k.registers,
                      smem_bytes=k.smem_bytes, est_us=_us(k.est_us))


def candidate_info(c: Candidate) -> CandidateInfo:
    return CandidateInfo(fusion_depth=int(c.fusion_depth), hbm_bytes=c.hbm_bytes, flops=c.flops, est_us=_us(c.est_us),
                         kernels=tuple(kernel_info(k) for k in c.kernels))


def explain_report(program: CompiledProgram) -> ExplainReport:
    """The report of a compiled program; its inputs are the function's tensor arguments in order,
    then the arrays it captured."""
    rewrite = program.rewrite
    stats = rewrite.report
    report = ExplainReport(
        function=program.graph.name,
        inputs=tuple(InputInfo(name=n.attr("name"), shape=n.shape, dtype=n.dtype.name) for n in program.graph.inputs),
        egraph=EGraphInfo(iterations=len(stats.iterations), enodes=stats.enodes, eclasses=len(rewrite.view.classes),
                          seconds=stats.seconds, stop_reason=stats.stop_reason.value),
        rules=tuple(RuleInfo(name=rule, ruleset=ruleset, matches=n) for rule, ruleset, n in stats.fired()),
        candidates=tuple(candidate_info(c) for c in program.candidates),
        chosen=program.chosen, chosen_by=program.chosen_by)
    report._program = program
    return report


class ReportError(TesseraError, ValueError):
    """A document that is not a `tessera_rw.explain/1` report."""


def _parsed(document: Any) -> Any:
    if not isinstance(document, (str, bytes, bytearray)):
        return document
    try:
        return json.loads(document)
    except json.JSONDecodeError as e:
        raise ReportError(f"the document is not JSON: {e}") from None


def _validated(cls: type[ExplainReport], data: Any) -> ExplainReport:
    if not isinstance(data, dict):
        raise ReportError(f"a report is a JSON object, got a {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the document'}: {err['msg']}"
                             for err in e.errors()[:3])
        more = f" (and {e.error_count() - 3} more)" if e.error_count() > 3 else ""
        raise ReportError(f"not a {SCHEMA} report: {problems}{more}") from None
