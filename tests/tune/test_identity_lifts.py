"""A normalization lifted to fused_normalization with nothing fused (the epilogue rules lift plain
norms so the ops after them can join) is never what extraction takes: the plain op in its e-class
is the same kernel, the one the benchmarks measure; where an epilogue joins, the lift is taken."""

from tessera_rw import op
from tessera_rw.algebra.ops.fused_norm import lifts_nothing


def test_a_lifted_normalization_fuses_nothing_only_with_both_ends_plain():
    assert lifts_nothing("fused_normalization", (("expr", "$0"), ("post", "$0"), ("norm", "softmax")))
    assert not lifts_nothing("fused_normalization", {"expr": "$0", "post": "mul($0,$1)"})
    assert not lifts_nothing("fused_normalization", {"expr": "exp($0)", "post": "$0"})
    assert not lifts_nothing("softmax", {"axis": 1})


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


def test_a_normalization_with_an_epilogue_is_the_lifted_kernel():
    x, v = op.tensor((4, 512, 768), "bf16"), op.tensor((768,), "bf16")
    program = op.kernel(lambda x, w, b: op.layernorm(x, w, b) * w + 1.0).program(x, v, v)
    assert [s.op for s in program.plan.steps] == ["fused_normalization"]
