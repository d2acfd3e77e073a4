"""Contiguous slices as views: no kernel, the operand's bytes at an offset. Views keep their base
buffer alive, compose offsets, and may be outputs (sharing one output buffer when disjoint);
everything else about a plan (nothing read after it is overwritten, no kernel in place) still
holds, checked by replaying plans and by the numpy executor against the graph's reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import Node
from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
from tessera_rw.lower.lowering import is_view, located, lower
from tessera_rw.lower.plan import VIEW_ALIGNMENT, BufferRole, KernelPlan

F32 = DType.float32
RNG = np.random.default_rng(7)


def sliced(x: Node, starts, stops, steps=None) -> Node:
    return make("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps or (1,) * len(starts)))


def rows(x: Node, a: int, b: int) -> Node:
    """x[a:b] on the first axis."""
    return sliced(x, (a, *(0,) * (x.type.ndim - 1)), (b, *x.shape[1:]))


def row(x: Node, i: int) -> Node:
    """x[i]: one row, its axis dropped (a slice, then a reshape, as indexing traces)."""
    return make("reshape", rows(x, i, i + 1), shape=x.shape[1:])


def replay(plan: KernelPlan) -> None:
    """Walk the plan tracking which value each buffer holds; every read must find its value at the
    offset its views put it, and outputs sharing a buffer must not overlap."""
    holds: dict[int, object] = {ref.buffer: ("input", name) for name, ref in plan.inputs}
    holds.update({ref.buffer: node for node, ref in plan.constants})
    for i, step in enumerate(plan.steps):
        assert not is_view(step.node), f"step {i} launches a view"
        for ref, arg in zip(step.inputs, step.node.args):
            base, offset = located(arg)
            expected = ("input", base.attr("name")) if base.op == "input" else base
            assert holds.get(ref.buffer) == expected, f"step {i} reads b{ref.buffer} after it was overwritten"
            assert (ref.type, ref.offset) == (arg.type, offset)
            assert ref.offset % VIEW_ALIGNMENT == 0 and ref.end <= plan.buffers[ref.buffer].nbytes
        assert step.output.buffer not in {r.buffer for r in step.inputs}, f"step {i} runs in place"
        assert step.output.offset == 0 and plan.buffers[step.output.buffer].nbytes >= step.output.type.nbytes
        holds[step.output.buffer] = step.node
    spans: dict[int, list[tuple[int, int]]] = {}
    for ref in plan.outputs:
        assert plan.buffers[ref.buffer].role is BufferRole.OUTPUT
        for a, b in spans.get(ref.buffer, []):
            assert ref.type.nbytes == 0 or ref.end <= a or b <= ref.offset, "two outputs overlap"
        spans.setdefault(ref.buffer, []).append((ref.offset, ref.end))


def check(graph: Graph, feeds: dict[str, np.ndarray]) -> KernelPlan:
    plan = lower(graph)
    replay(plan)
    with np.errstate(over="ignore", invalid="ignore"):          # exp of exp may overflow, alike in both
        got, want = run_plan_on_cpu(plan, feeds), evaluate(graph, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return plan


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_a_packed_gemm_result_is_returned_as_two_views_without_a_copy():
    m, k, n = 8, 16, 64
    a, b = make_input("a", (m + 1, k), F32), make_input("b", (k, n), F32)
    packed = make("matmul", a, b, accum_dtype=None)      # rows 0:m are dW, row m is db
    graph = Graph("packed", (a, b), (rows(packed, 0, m), row(packed, m)))
    plan = check(graph, {"a": normal(m + 1, k), "b": normal(k, n)})
    assert [s.op for s in plan.steps] == ["matmul"]
    dw, db = plan.outputs
    assert dw.buffer == db.buffer == plan.steps[0].output.buffer
    assert (dw.offset, db.offset) == (0, m * n * 4)
    assert len(plan.buffers_of(BufferRole.OUTPUT)) == 1
    assert f"b{db.buffer}+{m * n * 4}:f32[{n}]" in str(plan)


def test_slices_read_by_kernels_launch_nothing():
    m, n = 8, 64
    x = make_input("x", (m + 1, n), F32)
    h = make("exp", x)
    y = make("add", make("tanh", rows(h, 0, m)), row(h, m))        # the last row broadcast over the others
    plan = check(Graph("inside", (x,), (y,)), {"x": normal(m + 1, n)})
    assert [s.op for s in plan.steps] == ["exp", "tanh", "add"]
    assert plan.steps[2].inputs[1].offset == m * n * 4


def test_a_viewed_value_is_not_overwritten_while_a_view_of_it_is_still_to_be_read():
    # m's last direct reader is the tanh; its view v is read by the final add. Releasing m after
    # the tanh would let u take m's buffer and clobber v before the add reads it.
    x = make_input("x", (4, 8), F32)
    m = make("exp", x)
    v = rows(m, 0, 2)
    t = make("tanh", m)
    u = make("neg", t)
    out = make("add", v, rows(u, 2, 4))
    plan = check(Graph("alive", (x,), (out,)), {"x": normal(4, 8)})
    m_buffer = plan.steps[0].output.buffer
    assert [s.op for s in plan.steps] == ["exp", "tanh", "neg", "add"]
    assert plan.steps[2].output.buffer != m_buffer
    assert plan.steps[3].inputs[0].buffer == m_buffer


def test_views_of_views_add_their_offsets():
    x = make_input("x", (8, 4, 16), F32)
    e = make("exp", x)
    a = rows(e, 2, 6)                                         # 2 planes in: 2 * 256 bytes
    r = make("reshape", a, shape=(16, 16))
    b = rows(r, 4, 8)                                         # 4 rows of 64 bytes further
    plan = check(Graph("nested", (x,), (make("tanh", b),)), {"x": normal(8, 4, 16)})
    assert [s.op for s in plan.steps] == ["exp", "tanh"]
    assert plan.steps[1].inputs[0].offset == 2 * 256 + 4 * 64


def test_strided_or_misaligned_slices_stay_copies():
    x = make_input("x", (10, 3), F32)                         # a row is 12 bytes
    e = make("exp", x)
    columns = sliced(e, (0, 0), (10, 2))
    misaligned = rows(e, 1, 5)                                # contiguous, but 12 bytes in
    aligned = rows(e, 4, 8)                                   # 48 bytes in
    graph = Graph("copies", (x,), (make("tanh", columns), make("tanh", misaligned), make("tanh", aligned)))
    plan = check(graph, {"x": normal(10, 3)})
    assert [s.op for s in plan.steps].count("slice") == 2
    assert plan.steps[-1].inputs[0].offset == 48


def test_outputs_that_overlap_or_view_inputs_or_keep_little_of_their_base_are_copied():
    x = make_input("x", (256, 128), F32)                  # 128 KB: more than a small base
    e = make("exp", x)
    t = make("tanh", x)
    graph = Graph("outs", (x,), (e, row(e, 3), rows(x, 0, 32), row(t, 5)))
    plan = check(graph, {"x": normal(256, 128)})
    ops = [s.op for s in plan.steps]
    assert ops.count("transpose") == 3 and ops.count("slice") == 0
    assert len({ref.buffer for ref in plan.outputs}) == 4
    tanh_step = next(s for s in plan.steps if s.op == "tanh")
    assert plan.buffers[tanh_step.output.buffer].role is BufferRole.TEMP     # only a row of it is returned
    assert plan.steps[ops.index("tanh") + 1].op == "transpose"             # copied out right after it


def test_a_row_of_a_small_value_is_handed_back_in_place_whole_base_and_all():
    x = make_input("x", (64, 64), F32)                    # 16 KB: a copy's launch costs more than keeping it
    plan = check(Graph("small", (x,), (row(make("tanh", x), 5),)), {"x": normal(64, 64)})
    assert [s.op for s in plan.steps] == ["tanh"]
    assert plan.buffers[plan.outputs[0].buffer].nbytes == 64 * 64 * 4 and plan.outputs[0].offset == 5 * 64 * 4


def test_most_of_a_value_returned_as_a_view_keeps_it_in_the_output_buffer():
    x = make_input("x", (9, 64), F32)
    plan = check(Graph("most", (x,), (rows(make("exp", x), 0, 8),)), {"x": normal(9, 64)})
    assert [s.op for s in plan.steps] == ["exp"]
    assert plan.buffers[plan.outputs[0].buffer].nbytes == 9 * 64 * 4


# ---- random DAGs with slices -------------------------------------------------------------------

SLICES = ("rows", "row", "columns", "stepped", "part")
UNARY = ("exp", "tanh", "neg")


def random_slice(draw, a: Node) -> Node | None:
    if a.type.ndim != 2 or min(a.shape) < 2:
        return None
    h, w = a.shape
    kind = draw(st.sampled_from(SLICES))
    if kind == "rows":
        lo = draw(st.integers(0, h - 1))
        return rows(a, lo, draw(st.integers(lo + 1, h)))
    if kind == "row":
        return make("reshape", rows(a, (i := draw(st.integers(0, h - 1))), i + 1), shape=(1, w))
    if kind == "columns":
        return sliced(a, (0, 0), (h, draw(st.integers(1, w))))
    if kind == "stepped":
        return sliced(a, (0, 0), (h, w), (2, 1))
    i = draw(st.integers(0, h - 1))
    lo = draw(st.integers(0, w - 1))
    return sliced(a, (i, lo), (i + 1, draw(st.integers(lo + 1, w))))


@st.composite
def random_graphs(draw) -> Graph:
    """A DAG of elementwise ops, reshapes and slices over an (8, 8) and a (6, 4) input; several
    outputs, views among them. Rows are 32 and 16 bytes: whole rows are aligned runs, runs within
    a row mostly misaligned."""
    values = [make_input("x", (8, 8), F32), make_input("y", (6, 4), F32)]
    inputs = tuple(values)
    returned: list[Node] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "unary", "binary", "slice", "slice", "split", "reshape"]))
        computed = values[len(inputs):]
        if kind == "slice" and computed:        # slices of kernels' results, whose buffers get reused
            a = draw(st.sampled_from(computed))
        else:
            a = draw(st.sampled_from(values[-4:] if draw(st.booleans()) else values))   # chains and fans
        if kind == "unary":
            values.append(make(draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            same = [v for v in values if v.shape == a.shape]
            values.append(make(draw(st.sampled_from(("add", "mul"))), a, draw(st.sampled_from(same))))
        elif kind == "slice" and (s := random_slice(draw, a)) is not None:
            values.append(s)
            if draw(st.booleans()):
                # the sliced value's last direct read, new values that could take its buffer, and only
                # then (it depends on them) a read of the slice: the base must outlive its direct reads
                later = make(draw(st.sampled_from(UNARY)), make(draw(st.sampled_from(UNARY)), a))
                values.append(make("add", s, make("sum", later, axes=(0, 1), keepdims=True)))
        elif kind == "split" and a.type.ndim == 2 and a.op != "input":
            k = draw(st.integers(0, a.shape[0]))           # two parts of one result, both returned
            returned += [rows(a, 0, k), rows(a, k, a.shape[0])]
        elif kind == "reshape" and a.type.ndim == 2:
            values.append(make("reshape", a, shape=(a.shape[1], a.shape[0])))
    # the last value is returned, so most of what was built is live
    outputs = (values[-1], *returned, *(draw(st.sampled_from(values)) for _ in range(draw(st.integers(0, 3)))))
    return Graph("random", inputs, outputs)


@settings(max_examples=300, deadline=None)
@given(random_graphs(), st.integers(0, 2**31 - 1))
def test_random_plans_with_views_keep_every_value_until_its_last_read(graph, seed):
    rng = np.random.default_rng(seed)
    plan = check(graph, {"x": rng.standard_normal((8, 8)).astype(np.float32),
                         "y": rng.standard_normal((6, 4)).astype(np.float32)})
    kernels = [n for n in graph.nodes if n.op not in ("input", "reshape") and not is_view(n)]
    copies = [s for s in plan.steps if s.node not in set(kernels)]
    assert len(plan.steps) == len(kernels) + len(copies)
    assert all(s.op == "transpose" for s in copies)          # only outputs are ever copied
