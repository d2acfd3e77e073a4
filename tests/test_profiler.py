"""The profiler on the numpy executor: one record per plan step, the report's table, the Chrome
trace, nesting, graph.profile; and the GPU side's bookkeeping (event timing, costing against the
arch's roofline) with fakes, since launching needs a device."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from tessera_rw import graph, op, profiler
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import MathUnit, arch_named
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.plan_binding import bind_plan
from tessera_rw.codegen.step_timing import DeviceStepTimer, PlanRun, active_recorders

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def on_the_host(monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")


@op.kernel
def mm(a, b):
    return op.matmul(a, b)


@op.kernel
def linear(x, w, b):
    return op.gelu(x @ w + b)


@op.kernel
def attention(q, k, v):
    s = (q @ k.mT) * (q.shape[-1] ** -0.5)
    return op.softmax(s, axis=-1) @ v


def arrays(*shapes):
    return [RNG.standard_normal(s).astype(np.float32) for s in shapes]


MM = arrays((64, 32), (32, 128))                     # M=64, N=128, K=32
LINEAR = arrays((64, 32), (32, 128), (128,))
ATTENTION = arrays((2, 2, 64, 32), (2, 2, 64, 32), (2, 2, 64, 32))


def rendered(table) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    return console.file.getvalue()


def test_one_record_per_plan_step_with_the_plans_figures():
    program = attention.program(*ATTENTION)
    with profiler.session() as p:
        out = attention(*ATTENTION)
    assert len(p.records) == len(program.plan.steps) > 1
    assert [r.step for r in p.records] == list(range(len(program.plan.steps)))
    for r, kernel in zip(p.records, program.candidate.kernels):
        assert r.plan == program.plan.name and r.device == "host" and r.stream == 0 and r.roofline == "host"
        assert r.duration_ns > 0 and r.latency_ms == r.duration_ns / 1e6
        assert (r.kind, r.fused, r.flops, r.hbm_bytes) == (kernel.kind, kernel.fused, kernel.flops, kernel.hbm_bytes)
        assert r.occupancy is None                    # no GPU schedule ran
    starts = [r.start_ns for r in p.records]
    assert starts == sorted(starts) and p.start_ns <= starts[0] and p.records[-1].start_ns <= p.end_ns
    np.testing.assert_allclose(out, attention(*ATTENTION))


def test_a_matmul_counts_2mnk_flops_and_its_efficiency_is_against_the_host_roofline():
    with profiler.session() as p:
        mm(*MM)
    (r,) = p.records
    assert (r.name, r.kind, r.shape, r.flops) == ("gemm", "gemm", "64x128x32", 2 * 64 * 128 * 32)
    assert r.hbm_bytes >= (64 * 32 + 32 * 128 + 64 * 128) * 4
    roof = profiler.host_roofline()
    assert r.roofline_ns == pytest.approx(max(r.flops / roof.flops_per_s, r.hbm_bytes / roof.bytes_per_s) * 1e9)
    assert r.efficiency == pytest.approx(r.roofline_ns / r.duration_ns)
    assert r.bandwidth_gbps == pytest.approx(r.hbm_bytes / r.duration_ns)


def test_a_fused_kernel_is_named_by_its_kind_and_what_it_fused():
    with profiler.session() as p:
        linear(*LINEAR)
    assert [r.name for r in p.records] == ["gemm+bias+gelu"]
    assert p.records[0].fused == ("bias", "gelu")


def test_report_prints_the_profiler_columns_a_row_per_launch_and_a_total(capsys):
    with profiler.session() as p:
        linear(*LINEAR)
        attention(*ATTENTION)
    table = p.report()
    printed = capsys.readouterr().out
    assert [c.header for c in table.columns] == list(profiler.COLUMNS) == \
        ["Op", "Latency(ms)", "FLOPs(G)", "Bandwidth(GB/s)", "Efficiency(%)"]
    assert table.row_count == len(p.records) + 1
    assert "host roofline" in table.title and "numpy executor" in table.title
    assert repr(table) == str(table) == f"<profile: {len(p.records)} launch(es), " \
        f"{profiler._duration(sum(r.duration_ns for r in p.records))}>"     # the REPL's echo: one line
    cells = [list(c.cells) for c in table.columns]
    assert cells[0][-1] == "total" and cells[0][0] == "gemm+bias+gelu[64x128x32]"
    assert float(cells[1][-1]) == pytest.approx(p.total_ms, rel=1e-3)
    assert float(cells[2][-1]) == pytest.approx(sum(r.flops for r in p.records) / 1e9, rel=1e-3)
    for header in profiler.COLUMNS:
        assert header in printed
    assert "total" in printed


def test_report_groups_repeated_launches_of_one_kernel():
    with profiler.session() as p:
        for _ in range(3):
            mm(*MM)
    table = p.report(group=True, console=Console(file=io.StringIO()))
    ops = list(table.columns[0].cells)
    assert ops == ["gemm[64x128x32] (x3)", "total"]
    assert float(list(table.columns[2].cells)[0]) == pytest.approx(3 * 2 * 64 * 128 * 32 / 1e9, rel=1e-3)


def test_timeline_is_a_chrome_trace_with_one_complete_event_per_record(tmp_path):
    with profiler.session() as p:
        linear(*LINEAR)
        attention(*ATTENTION)
    path = p.timeline(tmp_path / "trace.json")
    assert path == tmp_path / "trace.json"
    with open(path) as f:
        trace = json.load(f)
    assert trace["displayTimeUnit"] == "ms"
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert len(complete) == len(p.records)
    for e, r in zip(complete, p.records):
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert e["name"] == r.name and e["cat"] == r.kind
        assert e["dur"] == pytest.approx(r.duration_ns / 1e3)                      # µs
        assert e["ts"] == pytest.approx((r.start_ns - p.start_ns) / 1e3)
        assert e["args"]["flops"] == r.flops and e["args"]["bytes"] == r.hbm_bytes
    ts = [e["ts"] for e in complete]
    assert all(t >= 0 for t in ts) and ts == sorted(ts)
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(complete, complete[1:]))  # one host thread
    names = {(e["name"], e["pid"], e["tid"]): e["args"]["name"] for e in meta}
    (pid, tid), = {(e["pid"], e["tid"]) for e in complete}
    assert names[("process_name", pid, 0)] == "host (numpy executor)" and names[("thread_name", pid, tid)] == "host"


def test_nothing_is_recorded_outside_a_session():
    mm(*MM)
    with profiler.session() as p:
        mm(*MM)
    mm(*MM)
    assert len(p.records) == 1 and active_recorders() == ()
    with profiler.session() as empty:
        pass
    assert empty.records == () and "no kernel ran" in empty.title()


def test_the_warm_call_fast_path_records_too():
    x = RNG.standard_normal((4, 64)).astype(np.float32)

    @op.kernel
    def scaled_softmax(x):
        return op.softmax(x * 0.5, axis=-1)
    scaled_softmax(x)                                 # compiled: later calls on arrays take the fast path
    with profiler.session() as p:
        for _ in range(3):
            scaled_softmax(x)
    steps = len(scaled_softmax.program(x).plan.steps)
    assert len(p.records) == 3 * steps


def test_nested_sessions_inner_records_and_outer_sees_everything():
    with profiler.session() as outer:
        mm(*MM)
        with profiler.session() as inner:
            linear(*LINEAR)
        mm(*MM)
    assert [r.name for r in inner.records] == ["gemm+bias+gelu"]
    assert [r.name for r in outer.records] == ["gemm", "gemm+bias+gelu", "gemm"]
    assert inner.records[0].start_ns == outer.records[1].start_ns


def test_a_session_is_closed_by_an_error_and_cannot_be_entered_twice_at_once():
    p = profiler.session()
    with pytest.raises(ValueError):
        with p:
            mm(*MM)
            raise ValueError("boom")
    assert active_recorders() == () and len(p.records) == 1
    with p:
        with pytest.raises(TesseraError, match="already open"):
            with p:
                pass
        mm(*MM)
    assert len(p.records) == 2                        # entered again later: the records accumulate


def test_module_level_timeline_and_report_use_the_last_session(tmp_path, capsys):
    with profiler.session() as p:
        mm(*MM)
    path = profiler.timeline(str(tmp_path / "last.json"))
    assert len([e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]) == 1
    assert profiler.report().row_count == 2 and "gemm[64x128x32]" in capsys.readouterr().out
    assert p.records


def test_graph_profile_prints_one_line_per_kernel_and_returns_the_session(capsys):
    def step():
        linear(*LINEAR)
        attention(*ATTENTION)
    p = graph.profile(step)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(p.records) > 2
    for line, r in zip(lines, p.records):
        assert line.startswith(f"{r.name}[{r.shape}]  latency=") and "efficiency=" in line
        assert "occupancy" not in line                # host launches have no GPU occupancy
    assert lines[0].startswith("gemm+bias+gelu[64x128x32]  latency=")
    assert graph.profile(mm, *MM).records[0].flops == 2 * 64 * 128 * 32


# -- the GPU side, without a GPU: what DevicePlan.run hands the recorder, and what becomes of it ----

class FakeEvent:
    def __init__(self, ms: float):
        self.ms, self.synced = ms, 0

    def __sub__(self, other: FakeEvent) -> float:
        return self.ms - other.ms

    def sync(self) -> None:
        self.synced += 1


class FakeStream:
    """Each event completes 1 ms after the one before; a launch takes 2 ms more."""

    def __init__(self):
        self.clock, self.events = 0.0, []

    def record(self, options=None) -> FakeEvent:
        assert options.timing_enabled
        self.clock += 1.0
        self.events.append(FakeEvent(self.clock))
        return self.events[-1]

    def launch(self) -> None:
        self.clock += 2.0


class Listener:
    def __init__(self):
        self.steps = []

    def record_step(self, run, step, start_ns, duration_ns):
        self.steps.append((run, step, start_ns, duration_ns))


def test_device_timer_syncs_once_and_reads_each_launch_from_its_events():
    stream, listener = FakeStream(), Listener()
    timer = DeviceStepTimer(stream)
    for i in range(3):
        timer.launch(i, stream.launch)
    assert [e.synced for e in stream.events] == [0] * 6         # nothing waits while launching
    run = PlanRun("plan", Numerics.DETERMINISTIC, "cuda:0", 7)
    timer.report((listener,), run)
    assert [e.synced for e in stream.events] == [0] * 5 + [1]   # one sync, on the last event
    assert [(s, d) for _, s, _, d in listener.steps] == [(0, 3_000_000), (1, 3_000_000), (2, 3_000_000)]
    starts = [s for _, _, s, _ in listener.steps]
    assert [b - a for a, b in zip(starts, starts[1:])] == [4_000_000, 4_000_000]


def test_gpu_records_are_costed_under_the_schedule_that_ran_against_the_arch_roofline(tmp_path):
    import ml_dtypes
    a = np.ones((256, 512), ml_dtypes.bfloat16)
    b = np.ones((512, 128), ml_dtypes.bfloat16)
    plan = mm.program(a, b).plan
    arch = arch_named("H100-SXM")
    bound = bind_plan(plan, arch)
    run = PlanRun(plan, Numerics.DETERMINISTIC, "cuda:0", 0x1234, arch, tuple(s.schedule for s in bound))
    p = profiler.session()
    with p:                                           # opened and closed: its clock starts
        pass
    p.record_step(run, 0, p.start_ns + 5_000, 20_000)
    (r,) = p.records
    assert (r.device, r.stream, r.roofline, r.name, r.shape) == ("cuda:0", 0x1234, "H100-SXM", "gemm", "256x128x512")
    assert r.flops == 2 * 256 * 128 * 512 and 0 < r.occupancy <= 1
    expected = max(r.flops / arch.peak_flops(MathUnit.BF16), r.hbm_bytes / arch.hbm_bytes_per_s) * 1e9
    assert r.roofline_ns == pytest.approx(expected) and r.efficiency == pytest.approx(expected / 20_000)
    assert "H100-SXM roofline" in p.title()
    assert "occupancy=" in r.summary()
    trace = json.loads(p.timeline(tmp_path / "gpu.json").read_text())
    meta = {e["name"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta == {"process_name": "cuda:0 (H100-SXM)", "thread_name": "stream 0x1234"}
    (event,) = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert event["ts"] == 5.0 and event["dur"] == 20.0 and event["args"]["occupancy_pct"] > 0


def test_profiling_an_example_gives_a_trace_perfetto_opens_and_the_guide_table(tmp_path):
    import importlib.util
    from pathlib import Path
    file = Path(__file__).resolve().parents[1] / "examples" / "transformer_block.py"
    spec = importlib.util.spec_from_file_location("transformer_block_example", file)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    params = example.random_parameters(np.random.default_rng(0), batch=2, seq=64, width=128)
    with profiler.session() as p:
        example.transformer_block(**params)
    steps = example.transformer_block.program(**params).plan.steps
    assert [r.step for r in p.records] == list(range(len(steps)))
    assert sum(r.kind == "gemm" for r in p.records) >= 4 and all(r.duration_ns > 0 for r in p.records)
    trace = json.loads(p.timeline(tmp_path / "block.json").read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(steps)
    console = Console(file=io.StringIO(), width=120)
    table = p.report(console=console)
    assert [c.header for c in table.columns] == list(profiler.COLUMNS)
    assert "gemm+bias+gelu[" in console.file.getvalue()


def test_an_empty_session_says_why_nothing_was_recorded():
    x = np.ones((8, 8), np.float32)
    with profiler.session() as p:
        op.softmax(x, axis=-1)                 # eager, on numpy: numpy runs it
    out = io.StringIO()
    p.report(console=Console(file=out, width=100))
    assert not p.records and "eager op calls on numpy arrays run numpy directly" in " ".join(out.getvalue().split())


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_kernels_run_in_the_emulator_are_recorded_and_labelled(monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "emulator")
    k = op.kernel(lambda x: op.softmax(x * 2.0, axis=-1))
    with profiler.session() as p:
        k(np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32))
    assert [r.device for r in p.records] == ["emulator"]
    assert "CUDA emulator" in p.title()


def test_a_host_roofline_probed_low_is_raised_to_what_kernels_reach(monkeypatch):
    from tessera_rw import host_roofline
    monkeypatch.setattr(host_roofline, "_measured_host_roofline", lambda: profiler.HostRoofline(1.0, 1.0))
    monkeypatch.setattr(host_roofline, "_HOST_SEEN", [0.0, 0.0])
    k = op.kernel(lambda a, b: op.softmax(a @ b, axis=-1))
    a = RNG.standard_normal((64, 64)).astype(np.float32)
    with profiler.session() as p:
        k(a, a)
    assert p.records and all(r.efficiency <= 1.0 + 1e-9 for r in p.records)
    assert max(r.efficiency for r in p.records) == pytest.approx(1.0)   # the fastest sets the roofline
