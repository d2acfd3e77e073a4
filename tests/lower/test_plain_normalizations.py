"""A lifted normalization that fuses nothing runs as its plain op; one that fuses something stays."""

import numpy as np

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.lower.plain_normalizations import plain_normalizations


def _lifted(*args, post="$0", **attrs):
    return make("fused_normalization", *args, expr="$0", post=post, **attrs)


def test_a_layer_norm_lifted_with_its_weight_and_bias_is_the_layer_norm_again():
    x, w, b = (make_input(name, shape, DType.float32) for name, shape in (("x", (4, 8)), ("w", (8,)), ("b", (8,))))
    lifted = _lifted(x, w, b, norm="layernorm", axes=(1,), eps=1e-5, has_weight=True, has_bias=True)
    graph = Graph("g", (x, w, b), (make("exp", lifted),))
    plain = plain_normalizations(graph)
    assert [n.op for n in plain.nodes if n.op != "input"] == ["layernorm", "exp"]
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "w": rng.standard_normal(8).astype(np.float32),
             "b": rng.standard_normal(8).astype(np.float32)}
    np.testing.assert_allclose(evaluate(plain, feeds)[0], evaluate(graph, feeds)[0], rtol=1e-6)


def test_a_normalization_with_an_epilogue_stays_fused_and_a_graph_without_one_is_returned_as_it_is():
    x = make_input("x", (4, 8), DType.float32)
    fused = _lifted(x, x, post="mul($0,$1)", norm="softmax", axes=(1,), eps=0.0, has_weight=False, has_bias=False)
    graph = Graph("g", (x,), (fused,))
    assert plain_normalizations(graph) is graph


def test_a_plain_layer_norm_is_planned_as_the_layer_norm_kernel():
    # a GPT block's pre-norm: 4 x 512 tokens of width 768, weight and bias, a GEMM after it
    x, w, b, proj = (op.tensor(shape, "bf16") for shape in ((4, 512, 768), (768,), (768,), (768, 2304)))
    k = op.kernel(lambda x, w, b, proj: op.layernorm(x, w, b) @ proj)
    assert [s.op for s in k.program(x, w, b, proj).plan.steps] == ["layernorm", "matmul"]


def test_a_lone_normalization_is_one_candidate_that_runs_as_itself():
    x, v = op.tensor((4, 512, 768), "bf16"), op.tensor((768,), "bf16")
    for norm, fn in (("softmax", lambda x, w, b: op.softmax(x, axis=-1)),
                     ("layernorm", lambda x, w, b: op.layernorm(x, w, b)), ("rmsnorm", lambda x, w, b: op.rmsnorm(x, w))):
        program = op.kernel(fn).program(x, v, v)
        assert [c.graph.op_counts() for c in program.candidates] == [{norm: 1}], norm
        assert [s.op for s in program.plan.steps] == [norm]
