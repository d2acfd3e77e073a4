"""The cost model picks the right program: fused attention at long sequences, direct or FFT convolution
by kernel size, shared work paid once, the same answer every time."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tessera_rw import op
from tessera_rw.algebra.builder import make, make_input
from tessera_rw.algebra.dtypes import DType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune.extract import FusionDepth, _still_a_kernel, extract_candidates

H100 = arch_named("H100-SXM")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ATTENTION = load_example("attention")


def candidates_of(fn, arch=H100, **inputs):
    graph = op.kernel(fn).trace(**inputs) if not hasattr(fn, "trace") else fn.trace(**inputs)
    return extract_candidates(rewrite(graph, rulesets()), arch)


def qkv(seq, head_dim=64, dtype="bf16"):
    return {n: op.tensor((4, 16, seq, head_dim), dtype) for n in "qkv"}


def moves_square(candidate, seq) -> bool:
    """Whether some kernel reads or writes a (…, seq, seq) tensor: the scores through HBM."""
    return any(t.shape[-2:] == (seq, seq) for k in candidate.kernels for t in (*k.op.operands, k.op.result))


@pytest.mark.parametrize("fn", [ATTENTION.attention, ATTENTION.causal_attention], ids=["plain", "causal"])
def test_long_attention_fuses_and_never_moves_the_scores_through_hbm(fn):
    candidates = candidates_of(fn, **qkv(4096))
    depths = [c.fusion_depth for c in candidates]
    assert len(set(depths)) >= 2 and FusionDepth.UNFUSED in depths
    best = candidates[0]
    assert best.fusion_depth is FusionDepth.FULL
    assert [k.kind for k in best.kernels] == ["flash_attention"]
    assert not moves_square(best, 4096)
    unfused = next(c for c in candidates if c.fusion_depth is FusionDepth.UNFUSED)
    assert moves_square(unfused, 4096)
    assert unfused.hbm_bytes > 10 * best.hbm_bytes
    assert unfused.est_us > 3 * best.est_us


def test_short_attention_is_launch_bound_and_the_model_says_so():
    """At S=16 every kernel of every candidate costs about its launch: fusion only saves launches,
    a close call left to on-device timing. At S=4096 the unfused kernels are bound by the S×S
    scores going through HBM."""
    short = candidates_of(ATTENTION.attention, **qkv(16))
    assert len({c.fusion_depth for c in short}) >= 2
    launch = H100.launch_us
    for c in short:
        assert all(k.bound == "launch" and "launch-bound" in k.why() for k in c.kernels)
        assert c.est_us == pytest.approx(len(c.kernels) * launch, rel=0.3)
    long_ = candidates_of(ATTENTION.attention, **qkv(4096))
    unfused = next(c for c in long_ if c.fusion_depth is FusionDepth.UNFUSED)
    assert {k.bound for k in unfused.kernels if k.kind != "gemm"} == {"memory"}


def conv1d_candidates(length, kernel, dtype="float32", channels=64, groups=1):
    x = op.tensor((16, channels, length), dtype)
    w = op.tensor((channels, channels // groups, kernel), dtype)
    return candidates_of(lambda x, w: op.conv1d(x, w, padding=(kernel - 1, 0), groups=groups), x=x, w=w)


def kinds(candidate):
    return {k.kind for k in candidate.kernels}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels, groups", [(64, 1), (256, 1), (768, 768)])
def test_a_short_convolution_stays_direct(dtype, channels, groups):
    assert kinds(conv1d_candidates(4096, 3, dtype, channels, groups)[0]) == {"conv"}


@pytest.mark.parametrize("dtype, length, kernel, channels, groups", [
    ("float32", 2048, 64, 64, 1), ("float32", 8192, 64, 64, 1), ("float32", 2048, 256, 64, 1),
    ("bfloat16", 2048, 128, 256, 1), ("bfloat16", 8192, 128, 256, 1),
    ("bfloat16", 8192, 1024, 768, 768), ("bfloat16", 8192, 8192, 768, 768),   # depthwise, Hyena-style
])
def test_a_long_convolution_goes_through_the_fft(dtype, length, kernel, channels, groups):
    # (bf16, 2048 long, a 64-tap filter over 256 channels stays direct: the weights' spectrum at n =
    # 4096 is staged as a zero-padded float32 copy, 1 GiB written and read again before the FFT)
    best = conv1d_candidates(length, kernel, dtype, channels, groups)[0]
    assert "conv" not in kinds(best) and {"fft", "gemm", "ifft"} <= kinds(best), kinds(best)


def test_a_64_tap_convolution_stays_direct_where_the_fft_path_costs_more():
    """The model weighs, it does not always take the FFT at 64 taps: with 64 bf16 channels the
    tensor-core direct conv (17 GFLOP) beats six FFT-path kernels whose weight spectrum alone is
    35 MB, and a depthwise 64-tap filter is 3 GFLOP of sliding window against five passes over
    the sequence's spectra."""
    assert kinds(conv1d_candidates(2048, 64, "bfloat16", 64)[0]) == {"conv"}
    assert kinds(conv1d_candidates(2048, 64, "bfloat16", 768, 768)[0]) == {"conv"}


@pytest.mark.parametrize("kernel", [3, 255])
def test_the_fft_and_the_direct_convolution_are_both_weighed_whichever_wins(kernel):
    """The cost model decides between the two forms, so the report shows the one it turned down."""
    found = conv1d_candidates(8192, kernel, "float32", 64, 1)
    forms = [("fft" in kinds(c), "conv" in kinds(c)) for c in found]
    assert (True, False) in forms and (False, True) in forms
    assert forms[0] == ((True, False) if kernel == 255 else (False, True))
    report = op.kernel(lambda x, w: op.conv1d(x, w, padding="same")).explain(
        op.tensor((8, 64, 8192), "float32"), op.tensor((64, 64, kernel), "float32"))
    labels = {row.split(": ", 1)[1].strip() for row in report.render().splitlines() if row.startswith("candidate ")}
    assert {"unfused, FFT", "unfused, direct conv"} <= labels, labels


def test_a_relu_on_its_own_is_one_candidate_however_it_is_spelt():
    """A fused_elementwise of one op launches the kernel the op does: not a second candidate."""
    x = op.tensor((8, 64, 56, 56), "bf16")
    assert len(candidates_of(lambda x: op.relu(op.flip(x, axis=(3,))), x=x)) == 1


def test_a_convolution_takes_the_relu_after_it_as_its_epilogue():
    x, w = op.tensor((8, 64, 56, 56), "bf16"), op.tensor((64, 64, 3, 3), "bf16")
    fused, unfused = candidates_of(lambda x, w: op.relu(op.conv2d(x, w, padding=1)), x=x, w=w)
    assert [(k.kind, k.fused) for k in fused.kernels] == [("conv", ("relu",))]
    assert [k.kind for k in unfused.kernels] == ["conv", "elementwise"]
    assert fused.est_us < unfused.est_us and fused.hbm_bytes < unfused.hbm_bytes


def test_a_large_2d_kernel_goes_through_the_fft_and_a_3x3_does_not():
    def conv2d(kernel):
        x, w = op.tensor((8, 32, 64, 64), "float32"), op.tensor((32, 32, kernel, kernel), "float32")
        return candidates_of(lambda x, w: op.conv2d(x, w, padding="same"), x=x, w=w)[0]
    assert {"fft", "ifft"} <= kinds(conv2d(31)) and "conv" not in kinds(conv2d(31))
    assert kinds(conv2d(3)) == {"conv"}


def test_a_shared_product_is_computed_once():
    """y = x @ w + b feeds both outputs: paying its GEMM twice (once fused with gelu) is dearer than
    one GEMM and an elementwise gelu over its result."""
    x, w, b = op.tensor((4096, 4096), "bf16"), op.tensor((4096, 4096), "bf16"), op.tensor((4096,), "bf16")

    def two_heads(x, w, b):
        y = x @ w + b
        return op.gelu(y), y
    best = candidates_of(two_heads, x=x, w=w, b=b)[0]
    assert [k.kind for k in best.kernels].count("gemm") == 1


def test_extraction_is_deterministic_and_survives_cycles():
    """x.mT.mT is x: the e-graph holds a cycle through the transposes, and extraction still
    decodes a program, the same one each time."""
    x, w = op.tensor((256, 512), "bf16"), op.tensor((512, 128), "bf16")
    fn = lambda x, w: op.relu(x.mT.mT @ w)  # noqa: E731
    runs = [candidates_of(fn, x=x, w=w) for _ in range(2)]
    assert [c.graph.outputs for c in runs[0]] == [c.graph.outputs for c in runs[1]]
    assert [n.op for n in runs[0][0].graph.nodes if n.op not in ("input",)] == ["gemm"]


def test_an_op_written_without_a_gpu_template_is_the_candidate_and_runs_on_the_host(monkeypatch):
    """float64 flash attention has no GPU template (its cost is infinite), and float64 no GPU
    kernels at all, so no extraction is finite: the program as written is the one candidate, and
    the numpy executor runs it blockwise in float64. float32 gets its unfused form beside it up to
    the attention ruleset's score limit, a plan the GPU runs; past the limit it keeps the fused node."""
    import numpy as np
    from tessera_rw import op
    from tessera_rw.rules.library.attention_unfused import UNFUSED_SCORES_LIMIT
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    r = np.random.default_rng(0).standard_normal((2, 2, 6, 4))
    f = op.kernel(lambda q, k, v: op.flash_attention(q, k, v))
    program = f.program(r, r, r)
    assert len(program.candidates) == 1 and not program.candidate.kernels[0].has_template
    s = r @ r.swapaxes(-1, -2) / 2
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ r
    got = f(r, r, r)
    assert got.dtype == np.float64 and np.abs(got - want).max() < 1e-13
    small = op.tensor((1, 2, 256, 64), "float32")
    assert "flash_attention" not in [s.op for s in f.program(small, small, small).plan.steps]
    seq = int((2 * UNFUSED_SCORES_LIMIT) ** 0.5)                    # 1 x 2 x seq² scores: over the limit
    big = op.tensor((1, 2, seq, 64), "float32")
    assert [s.op for s in f.program(big, big, big).plan.steps] == ["flash_attention"]


@pytest.mark.parametrize("arch, seq, head_dim", [("A100-SXM", 255, 256), ("H100-SXM", 128, 40)])
def test_bf16_attention_no_fused_kernel_takes_runs_unfused_on_the_gpu(arch, seq, head_dim):
    """The fused kernels take head dims of multiples of 16 that fit shared memory: 256 does not on
    sm_80, 40 nowhere. There the unfused form is the plan, every kernel of it a GPU one; where the
    fused kernel exists it wins."""
    import ml_dtypes
    import numpy as np
    from tessera_rw import op
    from tessera_rw.pipeline import compile_program
    f = op.kernel(lambda q, k, v: op.flash_attention(q, k, v, causal=True))
    x = op.tensor((2, 4, seq, head_dim), "bfloat16")
    program = compile_program(f.trace(x, x, x), arch)
    assert "flash_attention" not in [s.op for s in program.plan.steps]
    assert all(k.has_template for k in program.candidate.kernels)
    fused = op.tensor((2, 4, seq, 64), "bfloat16")
    assert [s.op for s in compile_program(f.trace(fused, fused, fused), arch).plan.steps] == ["flash_attention"]
    r = np.random.default_rng(0).standard_normal((1, 2, 9, head_dim)).astype(ml_dtypes.bfloat16)
    s = r.astype(np.float64) @ r.astype(np.float64).swapaxes(-1, -2) / np.sqrt(head_dim)
    s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ r.astype(np.float64)
    np.testing.assert_allclose(f(r, r, r).astype(np.float64), want, atol=3e-2)


def test_a_deeper_program_launching_the_same_kernels_is_not_a_second_candidate():
    """A lone product as a gemm node fusing nothing runs what the plain matmul runs: one candidate."""
    graph = op.kernel(lambda x, w: x @ w).trace(op.tensor((512, 256), "float32"), op.tensor((256, 128), "float32"))
    candidates = extract_candidates(rewrite(graph, rulesets()), H100)
    assert [(c.fusion_depth, [k.kind for k in c.kernels]) for c in candidates] == [(FusionDepth.UNFUSED, ["gemm"])]
    fused = op.kernel(lambda x, w: op.relu(x @ w)).trace(op.tensor((512, 256), "float32"),
                                                        op.tensor((256, 128), "float32"))
    assert len(extract_candidates(rewrite(fused, rulesets()), H100)) == 2      # gemm+relu against gemm, elementwise


def test_an_epilogue_merge_that_would_leave_no_gpu_kernel_is_refused():
    norm = dict(expr="$0", norm="log_softmax", axes=(1,), eps=0.0, has_weight=False, has_bias=False)
    z, picked = make_input("z", (8, 50), DType.float32), make_input("m", (8, 50), DType.bool)
    a, b = make_input("a", (8, 50), DType.float64), make_input("b", (1, 50), DType.float64)
    host = make("reduced_normalization", z, picked, **norm, post="where($1,$0,0.0:float32)", reduce="sum",
                keepdims=False)
    merged = make("reduced_normalization", z, a, b, **norm, post="where(lt($1,$2),$0,0.0:float32)", reduce="sum",
                  keepdims=False)
    assert _still_a_kernel(host, host) and not _still_a_kernel(host, merged)
