"""The runtime profiler: every kernel launch inside a block, timed, costed and set against a roofline.

>>> import numpy as np
>>> from tessera_rw import op, profiler
>>> @op.kernel
... def mm(a, b):
...     return op.matmul(a, b)
>>> a, b = np.ones((64, 32), np.float32), np.ones((32, 128), np.float32)
>>> with profiler.session() as p:
...     _ = mm(a, b)
>>> [(r.name, r.shape, r.flops) for r in p.records]
[('gemm', '64x128x32', 524288)]

Each record is one launch of one plan step: its kernel (the template's kind plus what it fused,
`gemm+bias+gelu`), its latency, and the FLOPs and HBM bytes the cost model gives the step, so its
achieved bandwidth is bytes / latency and its efficiency is the roofline time
max(FLOPs / peak, bytes / bandwidth) over the latency. On the GPU, latency comes from CUDA events
around each launch and the roofline is the program's ArchSpec (the dense peak of the kernel's math
unit, the HBM bandwidth). On the numpy executor a GPU roofline would mean nothing, so a host
roofline is measured once per process when first needed (a float32 matmul's FLOP/s and a large
copy's bytes/s, ~30 ms) and latency is the wall clock around each step. `p.report()` says which
roofline its efficiencies are against.

Sessions nest: an inner block records its launches, and every enclosing block records them too.
Kernels run on another thread are not seen (the scope is a context variable, as numerics policies
are). Recording costs nothing while no session is open: the executors read one context variable
per plan run. Costing happens when the records are first read, never while the kernels run.
"""

from __future__ import annotations

import json
import os
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.node import Node
from tessera_rw.codegen.arch import ArchSpec, MathUnit, target_arch
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.step_timing import EMULATOR, HOST, PlanRun, host_clock, recording
from tessera_rw.codegen.templates.base import Schedule
from tessera_rw.codegen.templates.registry import templates_for
from tessera_rw.host_roofline import HostRoofline, host_roofline, saw_host_rate
from tessera_rw.text_console import default_console
from tessera_rw.tune.cost import kernel_cost, schedule_cost
from tessera_rw.tune.extract import fusion_depth

__all__ = ["session", "Session", "KernelRecord", "HostRoofline", "host_roofline", "report", "timeline", "COLUMNS"]

COLUMNS = ("Op", "Latency(ms)", "FLOPs(G)", "Bandwidth(GB/s)", "Efficiency(%)")

class ProfileTable(Table):
    """The table `report()` prints; as a value it reads as one line (a REPL's echo, print()), since
    the table itself was printed already."""
    summary = ""

    def __repr__(self) -> str:
        return f"<profile: {self.summary}>"

    __str__ = __repr__


@dataclass(frozen=True)
class KernelRecord:
    """One kernel launch: what ran, where, when, and how close it came to the roofline."""
    name: str                   # kind and what it fused: 'gemm+bias+gelu', 'flash_attention+scale+softmax'
    kind: str
    fused: tuple[str, ...]
    shape: str                  # a GEMM's MxNxK (batch first); otherwise the result's shape: '4x16x2048x64'
    plan: str
    step: int                   # the step's index in its plan
    device: str                 # 'host' (the numpy executor) or 'cuda:<index>'
    stream: int                 # the CUDA stream's handle; 0 on the host
    start_ns: int               # time.perf_counter_ns's clock
    duration_ns: int
    flops: int
    hbm_bytes: int
    roofline_ns: float          # max(flops / peak, bytes / bandwidth) on `roofline`
    roofline: str               # what efficiency is against: 'host' or the GPU's arch name
    occupancy: float | None     # resident warps / the SM's maximum under the schedule that ran; GPU only

    @property
    def latency_ms(self) -> float:
        return self.duration_ns / 1e6

    @property
    def bandwidth_gbps(self) -> float:
        """Achieved HBM bandwidth: bytes / latency (bytes per ns are GB/s)."""
        return self.hbm_bytes / max(self.duration_ns, 1)

    @property
    def efficiency(self) -> float:
        """Roofline time / measured latency (1.0: at the roofline)."""
        return self.roofline_ns / max(self.duration_ns, 1)

    @property
    def label(self) -> str:
        """'gemm+bias[4096x4096x4096]': the kernel and its problem size."""
        return f"{self.name}[{self.shape}]"

    def summary(self) -> str:
        """'gemm[4096x4096x4096]  latency=196µs  occupancy=50%  efficiency=71%'"""
        occupancy = "" if self.occupancy is None else f"  occupancy={self.occupancy:.0%}"
        return f"{self.label}  latency={_duration(self.duration_ns)}{occupancy}  efficiency={self.efficiency:.0%}"


def _duration(ns: float) -> str:
    if ns < 1e6:
        return f"{ns / 1e3:.3g}µs"
    return f"{ns / 1e6:.3g}ms" if ns < 1e9 else f"{ns / 1e9:.3g}s"


@dataclass(frozen=True)
class _StepCost:
    name: str
    kind: str
    fused: tuple[str, ...]
    shape: str
    flops: int
    hbm_bytes: int
    unit: MathUnit
    occupancy: float | None


def _shape_label(node: Node, kind: str) -> str:
    args = [a.type.shape for a in node.args]
    if kind == "gemm" and len(args) >= 2 and len(args[0]) >= 2 and len(args[1]) >= 2:
        (m, k), n = args[0][-2:], args[1][-1]
        dims = (*node.type.shape[:-2], m, n, k)
    else:
        dims = node.type.shape
    return "x".join(map(str, dims)) or "scalar"


@lru_cache(maxsize=4096)
def _step_cost(node: Node, numerics: Numerics, arch: ArchSpec, schedule: Schedule | None) -> _StepCost:
    """A step's kernel as the cost model sees it: under the schedule that ran when it is known (the
    GPU), else under the template's best default schedule."""
    op = KernelOp.from_node(node, numerics)
    found = templates_for(op) if schedule is not None else ()
    if found:
        cost = schedule_cost(found[0], op, schedule, arch)
    else:
        cost = kernel_cost(op, arch, fused_op=fusion_depth(node.op) > 0)
    if cost is None:        # an op that launches nothing elsewhere, computed here: it streams its operands
        return _StepCost(node.op, node.op, (), _shape_label(node, node.op), op.flops,
                         op.operand_bytes + op.result.nbytes, MathUnit.FP32, None)
    name = "+".join((cost.kind, *cost.fused))
    occupancy = cost.occupancy if schedule is not None else None
    return _StepCost(name, cost.kind, cost.fused, _shape_label(node, cost.kind), cost.flops, cost.hbm_bytes,
                     MathUnit(cost.unit), occupancy)


def _gpu_roofline_ns(cost: _StepCost, arch: ArchSpec) -> float:
    peak = arch.peak_flops(cost.unit if arch.has(cost.unit) else MathUnit.FP32)
    return max(cost.flops / peak, cost.hbm_bytes / arch.hbm_bytes_per_s) * 1e9


def _gpu_roofline_text(arch: ArchSpec) -> str:
    return f"the {arch.name} roofline: dense peak of each kernel's math unit, {arch.hbm_gbps:.0f} GB/s HBM"


_LAST: ContextVar[Session | None] = ContextVar("tessera_rw_last_profile", default=None)


class Session:
    """The launches of one `with profiler.session() as p:` block; read them after (or during) it.

    A session may be entered again later: its records accumulate. Entering it while it is open
    is an error (it would record every launch twice).
    """

    def __init__(self) -> None:
        self._raw: list[tuple[PlanRun, int, int, int]] = []
        self._records: list[KernelRecord] = []
        self._rooflines: dict[str, str] = {}
        self._scope: Any = None
        self.start_ns: int | None = None
        self.end_ns: int | None = None

    def record_step(self, run: PlanRun, step: int, start_ns: int, duration_ns: int) -> None:
        # Called between kernels: keep only the facts, cost them when read.
        self._raw.append((run, step, start_ns, duration_ns))

    def __enter__(self) -> Session:
        if self._scope is not None:
            raise TesseraError("this profiler session is already open", op="profiler.session",
                               hint="nest a new profiler.session() instead; enclosing sessions see its records")
        if self.start_ns is None:
            self.start_ns = host_clock()
        self._scope = recording(self)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        scope, self._scope = self._scope, None
        scope.__exit__(*exc)
        self.end_ns = host_clock()
        _LAST.set(self)

    @property
    def records(self) -> tuple[KernelRecord, ...]:
        """Every launch so far, in the order they ran on each stream."""
        if len(self._records) < len(self._raw):
            fresh = self._raw[len(self._records):]
            costs = [self._cost(run, step) for run, step, _, _ in fresh]
            for (run, _, _, duration_ns), cost in zip(fresh, costs):
                if run.device == HOST:              # the host demonstrably reaches this rate
                    saw_host_rate(cost.flops, cost.hbm_bytes, duration_ns)
            for (run, step, start_ns, duration_ns), cost in zip(fresh, costs):
                roofline_ns, roofline, text = self._roofline(run, cost)
                self._rooflines[roofline] = text
                self._records.append(KernelRecord(
                    cost.name, cost.kind, cost.fused, cost.shape, run.plan.name, step, run.device, run.stream,
                    start_ns, duration_ns, cost.flops, cost.hbm_bytes, roofline_ns, roofline, cost.occupancy))
        return tuple(self._records)

    @staticmethod
    def _cost(run: PlanRun, step: int) -> _StepCost:
        node = run.plan.steps[step].node
        if run.device in (HOST, EMULATOR):
            return _step_cost(node, run.numerics, target_arch(), None)
        schedule = run.schedules[step] if step < len(run.schedules) else None
        return _step_cost(node, run.numerics, run.arch or target_arch(), schedule)

    @staticmethod
    def _roofline(run: PlanRun, cost: _StepCost) -> tuple[float, str, str]:
        """(roofline time of the step, the roofline's key, its description)."""
        if run.device in (HOST, EMULATOR):
            hr = host_roofline()
            roofline_ns = max(cost.flops / hr.flops_per_s, cost.hbm_bytes / hr.bytes_per_s) * 1e9
            text = str(hr) if run.device == HOST else f"{hr} (kernels run in the CUDA emulator: its times, not a GPU's)"
            return roofline_ns, run.device, text
        arch = run.arch or target_arch()
        return _gpu_roofline_ns(cost, arch), arch.name, _gpu_roofline_text(arch)

    @property
    def total_ms(self) -> float:
        """The latency of every recorded launch, summed."""
        return sum(r.duration_ns for r in self.records) / 1e6

    def title(self) -> str:
        records = self.records
        if not records:
            return "tessera_rw profile: no kernel ran"
        against = "; ".join(self._rooflines[r] for r in dict.fromkeys(r.roofline for r in records))
        return (f"tessera_rw profile: {len(records)} kernel launch(es), {self.total_ms:.4g} ms; "
                f"efficiency against {against}")

    def report(self, *, group: bool = False, console: Console | None = None) -> ProfileTable:
        """Print the table Op | Latency(ms) | FLOPs(G) | Bandwidth(GB/s) | Efficiency(%), one row per
        launch (`group=True`: one per kernel, its launches summed) and a total row; return it. Op is
        the kernel and its problem size, 'gemm+bias[64x128x32]'; FLOPs(G) is the work done (GFLOP).

        >>> import io
        >>> [c.header for c in Session().report(console=Console(file=io.StringIO())).columns]
        ['Op', 'Latency(ms)', 'FLOPs(G)', 'Bandwidth(GB/s)', 'Efficiency(%)']
        """
        records = self.records
        table = ProfileTable(title=self.title(), title_justify="left")
        table.summary = f"{len(records)} launch(es), {_duration(sum(r.duration_ns for r in records))}"
        for i, column in enumerate(COLUMNS):
            table.add_column(column, justify="left" if i == 0 else "right", no_wrap=i > 0, overflow="fold")
        if group:
            kernels: dict[tuple, list[KernelRecord]] = {}
            for r in records:
                kernels.setdefault((r.plan, r.step, r.device, r.label), []).append(r)
            rows = [(f"{rs[0].label} (x{len(rs)})" if len(rs) > 1 else rs[0].label, rs) for rs in kernels.values()]
        else:
            rows = [(r.label, [r]) for r in records]
        for name, rs in rows:
            table.add_row(name, *_figures(rs))
        table.add_section()
        table.add_row("total", *_figures(records), style="bold")
        if not records:
            table.caption = ("no kernel launched in the session: eager op calls on numpy arrays run numpy "
                             "directly; profile an @op.kernel (or op calls on GPU arrays)")
        (console or default_console()).print(table)
        return table

    def lines(self) -> list[str]:
        """One line per launch: 'gemm[64x128x32]  latency=12.3µs  efficiency=4%'."""
        return [r.summary() for r in self.records]

    def timeline(self, path: str | os.PathLike) -> Path:
        """Write the launches as a Chrome trace (Perfetto, chrome://tracing) to `path`; return it.
        One process per device, one thread per stream (the numpy executor is the 'host' thread);
        times are µs since the session opened."""
        records = self.records
        origin = min([self.start_ns or 0, *(r.start_ns for r in records)]) if records else (self.start_ns or 0)
        lanes: dict[tuple[str, int], tuple[int, int]] = {}
        pids: dict[str, int] = {}
        meta: list[dict] = []
        for r in records:
            if r.device not in pids:
                pids[r.device] = len(pids) + 1
                label = "host (numpy executor)" if r.device == HOST else f"{r.device} ({r.roofline})"
                meta.append(_metadata("process_name", pids[r.device], 0, label))
            if (r.device, r.stream) not in lanes:
                pid = pids[r.device]
                tid = 1 + sum(1 for d, _ in lanes if d == r.device)
                lanes[(r.device, r.stream)] = (pid, tid)
                meta.append(_metadata("thread_name", pid, tid, HOST if r.device == HOST else f"stream {r.stream:#x}"))
        events = []
        for r in sorted(records, key=lambda r: r.start_ns):
            pid, tid = lanes[(r.device, r.stream)]
            args = {"flops": r.flops, "bytes": r.hbm_bytes, "plan": r.plan, "step": r.step, "shape": r.shape,
                    "fused": list(r.fused), "bandwidth_gbps": round(r.bandwidth_gbps, 3),
                    "efficiency_pct": round(100 * r.efficiency, 2), "roofline": r.roofline}
            if r.occupancy is not None:
                args["occupancy_pct"] = round(100 * r.occupancy, 1)
            events.append({"name": r.name, "cat": r.kind, "ph": "X", "ts": (r.start_ns - origin) / 1e3,
                           "dur": r.duration_ns / 1e3, "pid": pid, "tid": tid, "args": args})
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))
        return path

    def __repr__(self) -> str:
        return f"<tessera_rw profiler session: {len(self._raw)} launch(es)>"


def _figures(records: list[KernelRecord] | tuple[KernelRecord, ...]) -> tuple[str, ...]:
    ns = sum(r.duration_ns for r in records)
    nbytes = sum(r.hbm_bytes for r in records)
    efficiency = sum(r.roofline_ns for r in records) / ns if ns else 0.0
    return (f"{ns / 1e6:.4g}", f"{sum(r.flops for r in records) / 1e9:.4g}",
            f"{nbytes / ns if ns else 0.0:.4g}", f"{100 * efficiency:.3g}")


def _metadata(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def session() -> Session:
    """A block whose kernel launches are recorded: `with profiler.session() as p: ...`, then
    `p.report()`, `p.timeline("trace.json")`, `p.records`.

    >>> with session() as p:
    ...     pass
    >>> p.records
    ()
    """
    return Session()


def _last() -> Session:
    found = _LAST.get()
    if found is None:
        raise TesseraError("no profiler session has closed yet in this context", op="profiler",
                           hint="run the kernels inside `with profiler.session() as p:` first")
    return found


def report(*, group: bool = False) -> ProfileTable:
    """`p.report()` of the session that closed last in this context."""
    return _last().report(group=group)


def timeline(path: str | os.PathLike) -> Path:
    """`p.timeline(path)` of the session that closed last in this context (`profiler.timeline("trace.json")`)."""
    return _last().timeline(path)
