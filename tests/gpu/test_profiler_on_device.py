"""The profiler on the GPU: launches timed by CUDA events on their stream (one sync per plan run),
costed against the device's ArchSpec, laid out on the stream's own thread in the trace."""

from __future__ import annotations

import json
import time

import ml_dtypes
import numpy as np
import pytest

from tessera_rw import graph, op, profiler
from tessera_rw.codegen import plan_runtime
from tessera_rw.codegen.arch import current_arch

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def on_the_gpu(monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "gpu")


@op.kernel
def mm(a, b):
    return op.matmul(a, b)


@op.kernel
def attention(q, k, v):
    s = (q @ k.mT) * (q.shape[-1] ** -0.5)
    return op.softmax(s, axis=-1) @ v


def random(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def test_a_gemm_is_timed_by_events_and_costed_against_the_arch():
    a, b = random((1024, 1024), ml_dtypes.bfloat16), random((1024, 1024), ml_dtypes.bfloat16)
    mm(a, b)                                              # compiled and warm
    before = time.perf_counter_ns()
    with profiler.session() as p:
        out = mm(a, b)
    wall = time.perf_counter_ns() - before
    (r,) = p.records
    assert r.device.startswith("cuda:") and r.stream != 0 and r.roofline == current_arch().name
    assert r.name.startswith("gemm") and r.shape == "1024x1024x1024" and r.flops == 2 * 1024 ** 3
    assert 0 < r.duration_ns < wall
    assert p.start_ns <= r.start_ns and r.start_ns + r.duration_ns <= p.end_ns
    assert 0 < r.occupancy <= 1 and 0 < r.efficiency <= 1.2      # no kernel beats the dense peak
    assert current_arch().name in p.title()
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=3e-2, atol=3e-1)


def test_every_step_of_a_plan_is_one_record_in_stream_order(tmp_path):
    q, k, v = (random((2, 4, 256, 64)) for _ in range(3))
    program = attention.program(q, k, v)
    attention(q, k, v)
    with profiler.session() as p:
        attention(q, k, v)
        attention(q, k, v)
    steps = len(program.plan.steps)
    assert len(p.records) == 2 * steps
    assert [r.step for r in p.records] == list(range(steps)) * 2
    assert len({(r.device, r.stream) for r in p.records}) == 1
    for a, b in zip(p.records, p.records[1:]):          # one stream: launches never overlap
        assert a.start_ns + a.duration_ns <= b.start_ns + 1_000
    trace = json.loads(p.timeline(tmp_path / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(p.records)
    assert all(e["ts"] >= 0 and e["dur"] > 0 and {"flops", "bytes", "occupancy_pct"} <= e["args"].keys()
               for e in complete)
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert threads == [f"stream {p.records[0].stream:#x}"]


def test_no_events_are_recorded_without_a_session(monkeypatch):
    a, b = random((256, 256)), random((256, 256))
    mm(a, b)

    class Refuse:
        def __init__(self, stream):
            raise AssertionError("timed a launch outside a profiler session")
    monkeypatch.setattr(plan_runtime, "DeviceStepTimer", Refuse)
    mm(a, b)
    with pytest.raises(AssertionError, match="outside a profiler session"):
        with profiler.session():
            mm(a, b)


def test_graph_profile_shows_occupancy_on_the_gpu(capsys):
    a, b = random((512, 512), ml_dtypes.bfloat16), random((512, 512), ml_dtypes.bfloat16)
    mm(a, b)
    p = graph.profile(mm, a, b)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{p.records[0].name}[512x512x512]  latency=") and "occupancy=" in line
