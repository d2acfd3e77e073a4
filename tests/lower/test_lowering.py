"""Lowering a Graph to a KernelPlan: which nodes launch, buffer reuse, and the plan's invariants
(nothing read after it is overwritten, no kernel in place, every output its own buffer), checked on
random DAGs by replaying the plan and by the numpy executor against the graph's reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tessera_rw.algebra.builder import make, make_constant, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.lower.lowering import lower
from tessera_rw.lower.plan import BufferRole, KernelPlan

F32 = DType.float32
UNARY = ("exp", "tanh", "neg", "sigmoid")
BINARY = ("add", "mul", "sub", "maximum")


@st.composite
def random_graphs(draw) -> Graph:
    """A DAG of elementwise ops, reshapes and reductions over two (8, 6) inputs; several outputs."""
    values = [make_input("x", (8, 6), F32), make_input("y", (8, 6), F32)]
    inputs = tuple(values)
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["unary", "binary", "reshape", "sum", "const"]))
        a = draw(st.sampled_from(values))
        if kind == "unary":
            values.append(make(draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            same = [v for v in values if v.shape == a.shape]
            values.append(make(draw(st.sampled_from(BINARY)), a, draw(st.sampled_from(same))))
        elif kind == "reshape" and a.type.numel == 48:
            values.append(make("reshape", a, shape=draw(st.sampled_from([(48,), (6, 8), (2, 24), (8, 6)]))))
        elif kind == "sum" and a.type.ndim == 2:
            values.append(make("sum", a, axes=(draw(st.sampled_from([0, 1])),), keepdims=True))
        elif kind == "const":
            values.append(make("mul", a, make_constant(draw(st.sampled_from([0.5, 2.0])), F32)))
    count = draw(st.integers(1, 3))
    outputs = tuple(draw(st.sampled_from(values)) for _ in range(count))
    return Graph("random", inputs, outputs)


def replay(plan: KernelPlan) -> None:
    """Walk the plan tracking which value each buffer holds; every read must find its value."""
    holds: dict[int, object] = {ref.buffer: ("input", name) for name, ref in plan.inputs}
    holds.update({ref.buffer: node for node, ref in plan.constants})
    written: dict[object, int] = {}
    for i, step in enumerate(plan.steps):
        for ref, arg in zip(step.inputs, step.node.args):
            base = arg
            while base.op == "reshape":
                base = base.args[0]
            expected = ("input", base.attr("name")) if base.op == "input" else base
            assert holds.get(ref.buffer) == expected, f"step {i} reads b{ref.buffer} after it was overwritten"
            assert ref.type == arg.type
        assert step.output.buffer not in {r.buffer for r in step.inputs}, f"step {i} runs in place"
        assert plan.buffers[step.output.buffer].nbytes >= step.output.type.nbytes
        assert plan.buffers[step.output.buffer].role in (BufferRole.TEMP, BufferRole.OUTPUT)
        holds[step.output.buffer] = step.node
        written[step.node] = step.output.buffer
    buffers = [ref.buffer for ref in plan.outputs]
    assert len(set(buffers)) == len(buffers), "two outputs share a buffer"
    assert all(plan.buffers[b].role is BufferRole.OUTPUT for b in buffers)


@settings(max_examples=80, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_plans_keep_every_value_until_its_last_read(graph, seed):
    plan = lower(graph)
    replay(plan)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((8, 6)).astype(np.float32) + 0.5,
             "y": rng.standard_normal((8, 6)).astype(np.float32) - 0.5}
    got = run_plan_on_cpu(plan, feeds)
    want = evaluate(graph, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_chain_takes_turns_between_two_temporaries():
    x = make_input("x", (1 << 20,), F32)
    y = x
    for name in UNARY * 5:
        y = make(name, y)
    plan = lower(Graph("chain", (x,), (y,)))
    assert len(plan.steps) == 20
    assert len(plan.buffers_of(BufferRole.TEMP)) == 2
    assert plan.temp_bytes == 2 * (4 << 20)
    # named as buffers that hold several values, not as one of them; outputs by their position
    assert [b.name for b in plan.buffers] == ["x", "tmp0", "tmp1", "out0"]


def test_a_temporary_grows_to_the_largest_value_it_holds():
    x = make_input("x", (64,), F32)
    small = make("exp", x)
    big = make("broadcast_to", make("tanh", small), shape=(16, 64))
    out = make("sum", make("exp", big), axes=(0,), keepdims=False)
    plan = lower(Graph("grow", (x,), (out,)))
    replay(plan)
    assert max(b.nbytes for b in plan.buffers_of(BufferRole.TEMP)) == 16 * 64 * 4


def test_reshapes_are_views_and_other_layout_ops_are_copies():
    x = make_input("x", (4, 6), F32)
    t = make("transpose", make("reshape", make("exp", x), shape=(6, 4)), axes=(1, 0))
    plan = lower(Graph("views", (x,), (make("reshape", t, shape=(24,)),)))
    assert [s.op for s in plan.steps] == ["exp", "transpose"]
    assert plan.steps[1].inputs[0].type.shape == (6, 4)        # the exp's buffer read at the reshaped shape
    assert plan.outputs[0].type.shape == (24,)


def test_outputs_that_are_inputs_or_repeats_are_copied_out():
    x = make_input("x", (3,), F32)
    e = make("exp", x)
    plan = lower(Graph("f", (x,), (x, e, e)))
    replay(plan)
    assert [s.op for s in plan.steps] == ["exp", "transpose", "transpose"]
    assert [b.name for b in plan.buffers_of(BufferRole.OUTPUT)] == ["out1", "out2", "out0"]
    out = run_plan_on_cpu(plan, {"x": np.arange(3, dtype=np.float32)})
    np.testing.assert_array_equal(out[0], np.arange(3, dtype=np.float32))
    assert out[1] is not out[2] and np.array_equal(out[1], out[2])


def test_constants_get_their_own_buffers():
    x = make_input("x", (5,), F32)
    plan = lower(Graph("c", (x,), (make("add", x, make_constant(1.5, F32)),)))
    assert [b.role for b in plan.buffers] == [BufferRole.INPUT, BufferRole.CONSTANT, BufferRole.OUTPUT]
    assert run_plan_on_cpu(plan, {"x": np.zeros(5, np.float32)})[0].tolist() == [1.5] * 5
    assert "1 kernel(s)" in str(plan)
