"""Every example runs and shows what it says it shows.

For each examples/*.py: its main() checks its kernels against its own numpy version on small inputs
(exit status 0), its example_inputs() names every kernel parameter, and each kernel's program at
those inputs (traced and compiled, nothing run) contains the rewrite the example is about.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tessera_rw.codegen import emulator, emulator_plan
from tessera_rw.execute import DEVICE_VARIABLE
from tessera_rw.kernel import Kernel
from tessera_rw.pipeline import CompiledProgram

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FILES = sorted(EXAMPLES.glob("*.py"))


@pytest.fixture(scope="module", autouse=True)
def tuning_cache(tmp_path_factory):
    """The autotune example writes its named cache here, not under the user's cache folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("tessera-cache")))
        yield


_MODULES: dict[str, object] = {}


def example(stem: str):
    """The example module, imported once per test run (its kernels keep their traces)."""
    if stem not in _MODULES:
        spec = importlib.util.spec_from_file_location(f"examples_{stem}", EXAMPLES / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[stem] = module
    return _MODULES[stem]


def kernels_of(module) -> list[Kernel]:
    return [v for v in vars(module).values() if isinstance(v, Kernel)]


def step_ops(program: CompiledProgram) -> list[str]:
    return [step.op for step in program.plan.steps]


# -- what each kernel's chosen program must show --------------------------------------------------------

ATTENTION_STEPS = ("flash_attention", "strided_attention")     # the latter reads and writes views in place


def flash_attention_fused(program: CompiledProgram) -> None:
    assert sum(step_ops(program).count(op) for op in ATTENTION_STEPS) == 1, step_ops(program)
    assert "softmax" not in step_ops(program)


def causal_flash_attention(program: CompiledProgram) -> None:
    flash_attention_fused(program)
    (step,) = [s for s in program.plan.steps if s.op in ATTENTION_STEPS]
    assert step.node.attr_map["causal"] is True


def fused_attention_backward(program: CompiledProgram) -> None:
    assert step_ops(program) == ["flash_attention_lse", "attention_row_stats_from_lse", "flash_attention_bwd"], \
        step_ops(program)
    assert len({ref.buffer for ref in program.plan.outputs}) == 1              # dQ, dK, dV: views of one buffer


def transformer_block_fused(program: CompiledProgram) -> None:
    causal_flash_attention(program)
    gemms = [k for k in program.candidate.kernels if k.kind == "gemm"]
    assert len(gemms) == 4                                      # QKV, output, MLP up and down projections
    assert sum("bias" in k.fused for k in gemms) >= 3 and any("gelu" in k.fused for k in gemms)
    assert step_ops(program).count("layernorm") + step_ops(program).count("fused_normalization") == 2
    # q, k and v read where the projection wrote them, the heads written merged: no copy kernel
    assert "strided_attention" in step_ops(program) and not {"transpose", "strided_copy"} & set(step_ops(program))


def spectral_convolution(program: CompiledProgram) -> None:
    ops = step_ops(program)
    assert "conv1d" not in ops and {"rfft", "irfft", "spectral_contract"} <= set(ops), ops
    kinds = {k.kind for k in program.candidate.kernels}
    assert {"fft", "ifft"} <= kinds
    # the gates and the value are read where the projection wrote them, the conv's crop where irfft did
    assert "slice" not in ops and ops.count("strided_elementwise") == 2


def convolutions_with_their_epilogues(program: CompiledProgram) -> None:
    assert [(s.op, s.node.attr_map["post"]) for s in program.plan.steps] == [
        ("fused_conv", "relu(add($0,$1))"), ("fused_conv", "relu(add(add($0,$1),$2))")]
    assert [k.fused for k in program.candidate.kernels] == [("relu", "add")] * 2


def backward_gemms_with_epilogues(program: CompiledProgram) -> None:
    assert len(program.plan.outputs) == 5                       # dx, dW1, db1, dW2, db2
    gemms = [k for k in program.candidate.kernels if k.kind == "gemm"]
    assert len(gemms) == 5                      # dh, dW2, dW1, dx and the recomputed pre-activation
    assert any("bias" in k.fused for k in gemms)
    assert sum("bias_grad" in k.fused for k in gemms) == 2                       # db1 with dW1, db2 with dW2
    # gelu'(pre) · dh is the epilogue of the gemm writing dh; the recomputed pre and gelu(pre) come
    # out of one gemm_pre_act, so no kernel is elementwise
    assert [k.fused for k in gemms if k.op.op == "gemm" and "dgelu" in k.fused] == [("dgelu",)]
    assert [k.fused for k in gemms if k.op.op == "gemm_pre_act"] == [("bias", "pre", "gelu")]
    assert "elementwise" not in [k.kind for k in program.candidate.kernels]
    assert "reduction" not in [k.kind for k in program.candidate.kernels]


def embedding_step_fused(program: CompiledProgram) -> None:
    ops = step_ops(program)
    assert {"take", "index_add", "reduced_normalization", "multi_elementwise"} <= set(ops), ops
    assert ops.count("multi_elementwise") == 1 and ops[-1] == "multi_elementwise"     # table, m, v at once


def training_step_fused(program: CompiledProgram) -> None:
    ops = step_ops(program)
    assert {"strided_attention_lse", "strided_attention_row_stats_from_lse", "strided_attention_bwd",
            "norm_backward_stats"} <= set(ops), ops
    # q, k and v read where the projection wrote them, dO where the output projection's gradient
    # did, O written with the heads merged for the output projection, and dQ, dK, dV written as the
    # projection's gradient: the attention launches no copy
    assert not {"strided_copy", "strided_concatenate", "concatenate", "pad", "transpose"} & set(ops), ops
    kernels = program.candidate.kernels
    assert any(k.kind == "layernorm" and {"residual", "row_stats"} <= set(k.fused) for k in kernels)
    assert any("bias_grad" in k.fused for k in kernels) and any("dgelu_tanh" in k.fused for k in kernels)


def tuned_linear_gelu(program: CompiledProgram) -> None:
    (gemm,) = program.candidate.kernels
    assert gemm.kind == "gemm" and set(gemm.fused) == {"bias", "gelu"}
    assert program.tuning is not None and program.chosen_by in ("cost_model", "on_device", "cache")
    assert program.schedules


def fp8_gemm_reading_the_weight_in_place(program: CompiledProgram) -> None:
    (gemm,) = program.candidate.kernels
    assert gemm.kind == "gemm" and set(gemm.fused) >= {"bias", "gelu"}
    (step,) = program.plan.steps
    assert step.node.attr("trans_b") and gemm.op.operands[0].dtype.value == "float8_e4m3"


def fp8_gemm_reading_a_transposed_weight(program: CompiledProgram) -> None:
    """W stored [in, out]: one copy lays it out k-major for the fp8 wgmma, which reads it transposed."""
    transpose, gemm = program.plan.steps
    assert transpose.op == "transpose" and transpose.node.args[0].op == "input"
    assert gemm.op == "gemm" and gemm.node.attr("trans_b") and gemm.node.args[1] is transpose.node
    assert program.candidate.kernels[1].schedule.startswith("tma ")      # the wgmma kernel, not mma.sync


def rotary_in_one_kernel(program: CompiledProgram) -> None:
    assert step_ops(program) == ["concatenated_elementwise"]
    assert {"concatenate", "neg", "strided_read"} <= set(program.candidate.kernels[0].fused)


def llama_block_as_hf_writes_it(program: CompiledProgram) -> None:
    ops = step_ops(program)
    assert ops.count("rmsnorm") == 2 and "gated_gemm" in ops                  # both norms, and the SwiGLU gate
    (attention,) = [s for s in program.plan.steps if s.op in ATTENTION_STEPS]
    assert attention.node.attr_map["causal"] is True and attention.node.attr_map.get("has_mask") is not True
    assert not {"fused_elementwise", "transpose", "broadcast_to", "cast", "triu", "full"} & set(ops), ops


def windowed_flash_attention(program: CompiledProgram) -> None:
    """One kernel, the band read as a window of seq/4 keys: no mask built, none read."""
    assert step_ops(program) == ["flash_attention"], step_ops(program)
    attrs = program.plan.steps[0].node.attr_map
    assert attrs["causal"] is True and attrs["window"] == 2048 // 4 and attrs["has_mask"] is False


def swiglu_reading_the_halves_in_place(program: CompiledProgram) -> None:
    """Two products (fusing nothing, a gemm is the plain matmul) and the gate reading both halves of
    the first where they lie."""
    assert [{"matmul": "gemm"}.get(o, o) for o in step_ops(program)] == ["gemm", "strided_elementwise", "gemm"]


def stem_step_with_its_pools(program: CompiledProgram) -> None:
    """The pool and its gradient (the relu's mask in its epilogue) a kernel each, the batch norm's
    per-channel sums one, the weight gradient reading the images where they lie, and no kernel of
    the tiny per-channel values."""
    ops = step_ops(program)
    assert ops.count("max_pool2d") == 1 and ops.count("fused_max_pool2d_grad") == 1, ops     # the relu's mask in it
    assert ops.count("multi_reduction") == 1 and "strided_conv" in ops, ops
    channels = [s.op for s in program.plan.steps if s.node.type.shape == (1, 64, 1, 1)]
    assert channels == ["fused_reduction", "fused_reduction"], ops          # μ and σ², nothing else per channel
    assert len(ops) == 12, ops


EXPECTED = {
    ("attention", "attention"): flash_attention_fused,
    ("attention", "causal_attention"): causal_flash_attention,
    ("attention", "sliding_window_attention"): windowed_flash_attention,
    ("attention_backward", "attention_grads"): fused_attention_backward,
    ("transformer_block", "transformer_block"): transformer_block_fused,
    ("hyena_conv", "hyena_block"): spectral_convolution,
    ("resnet_block", "resnet_block"): convolutions_with_their_epilogues,
    ("resnet_stem", "stem_step"): stem_step_with_its_pools,
    ("mlp_backward", "mlp_backward"): backward_gemms_with_epilogues,
    ("training_step", "block_loss_and_grads"): training_step_fused,
    ("embedding_step", "embedding_step"): embedding_step_fused,
    ("matmul_autotune", "linear_gelu"): tuned_linear_gelu,
    ("fp8_linear", "fp8_linear"): fp8_gemm_reading_the_weight_in_place,
    ("fp8_linear", "fp8_linear_in_out"): fp8_gemm_reading_a_transposed_weight,
    ("rotary_swiglu", "rotary_embedding"): rotary_in_one_kernel,
    ("rotary_swiglu", "swiglu_mlp"): swiglu_reading_the_halves_in_place,
    ("llama_block", "llama_block"): llama_block_as_hf_writes_it,
}


def test_the_examples_are_all_here():
    assert {f.stem for f in FILES} == {stem for stem, _ in EXPECTED}


@pytest.mark.parametrize("stem", [f.stem for f in FILES])
def test_main_checks_every_kernel_against_numpy(stem, capsys):
    module = example(stem)
    assert module.main() == 0
    lines = capsys.readouterr().out.splitlines()
    for k in kernels_of(module):
        assert any(line.startswith(k.name) and "ok" in line for line in lines), (k.name, lines)


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
@pytest.mark.parametrize("stem", [f.stem for f in FILES])
def test_main_passes_with_the_generated_cuda_kernels_run_in_the_emulator(stem, monkeypatch, capsys):
    plans = []
    run = emulator_plan.run_plan_emulated
    monkeypatch.setattr(emulator_plan, "run_plan_emulated", lambda plan, *a, **k: plans.append(plan) or run(plan, *a, **k))
    monkeypatch.setenv(DEVICE_VARIABLE, "emulator")
    assert example(stem).main() == 0, capsys.readouterr().out
    assert plans, "no plan ran in the emulator"


def test_main_fails_when_a_kernel_disagrees_with_numpy(monkeypatch, capsys):
    module = example("attention")
    reference = module.attention_reference
    monkeypatch.setattr(module, "attention_reference",
                        lambda q, k, v, causal=False, window=None: reference(q, k, v, causal, window) * 1.01)
    assert module.main() == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("stem", [f.stem for f in FILES])
def test_example_inputs_name_every_kernel_parameter(stem):
    module = example(stem)
    inputs = module.example_inputs()
    assert kernels_of(module), f"{stem} defines no @op.kernel"
    for k in kernels_of(module):
        missing = set(k.parameter_names) - set(inputs)
        assert not missing, f"{stem}.example_inputs() lacks {sorted(missing)} for {k.name}"


@pytest.mark.parametrize("stem, name", sorted(EXPECTED))
def test_the_chosen_program_has_the_rewrite(stem, name):
    module = example(stem)
    kernel = getattr(module, name)
    inputs = module.example_inputs()
    program = kernel.program(**{p: inputs[p] for p in kernel.parameter_names})
    EXPECTED[stem, name](program)


def test_the_autotune_example_kernel_tunes_into_its_named_cache():
    module = example("matmul_autotune")
    settings = module.linear_gelu.tuning
    assert settings is not None and settings.cache == module.CACHE == "examples"
