"""`tessera-rewrite`: explain runs on the examples; bad invocations give one line and exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tessera_rw
from tessera_rw.cli import main
from tessera_rw.codegen import emulator

ROOT = Path(__file__).resolve().parents[1]


def test_explain_with_example_inputs(capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py:attention")]) == 0
    out = capsys.readouterr().out
    assert "def attention(q: bf16[4,16,2048,64]" in out and "softmax" in out


def test_explain_with_inputs(capsys):
    shape = "2x4x128x64:fp32"
    assert main(["--explain", str(ROOT / "examples/attention.py:causal_attention"),
                 "--input", f"q={shape}", "--input", f"k={shape}", "--input", f"v={shape}"]) == 0
    assert "f32[2,4,128,64]" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--explain", "nope.py:f"], "no such file"),
    (["--explain", "README.md"], "is not a Python file"),
    (["--explain", "examples/attention.py:missing"], "no function 'missing'"),
    (["--explain", "examples/attention.py:"], "FILE.py:FUNCTION"),
    (["--explain", "examples/attention.py:attention", "--input", "z=4x8"], "has no parameter 'z'"),
    (["--explain", "examples/attention.py:attention", "--input", "q=4xZ"], "malformed --input"),
    (["--explain", "examples/attention.py:attention", "--input", "q=4x4:float13"], "float13"),
    (["--explain", "examples/attention.py:attention", "--input", "q=4x8"], "contraction dims differ"),
    (["--explain", "examples/attention.py:attention", "--input", "q=4x8", "--input", "k=5x8",
      "--input", "v=4x8"], "matmul"),
    ([], "--explain"),
    (["bogus"], "unknown command 'bogus': the commands are rules, cache, tune"),
    (["explain", "examples/attention.py:attention"], "to explain a file, --explain examples/attention.py:attention"),
    (["--explain", "examples"], "examples is a folder: name a .py file in it"),
    (["--explain", "examples/attention.py:example_inputs"], "takes no arguments, so it computes on no tensors: it is "
                                                            "not a kernel; the kernels of examples/attention.py are "
                                                            "attention, causal_attention"),
])
def test_bad_invocations_print_one_line_and_exit_2(args, says, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    message, hint = err.rstrip("\n").split("\n")      # one line, then the usage (or the error's hint)
    assert message.startswith("tessera-rewrite: ") and hint.startswith(("usage: ", "hint: "))


def test_help_names_the_other_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f"tessera-rewrite {name}" in out for name in ("tune", "rules", "cache"))
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"tessera-rewrite {tessera_rw.__version__}\n"


def test_console_script_is_installed():
    done = subprocess.run([sys.executable, "-m", "tessera_rw.cli", "--explain", "missing.py:f"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "no such file" in done.stderr


def test_explain_shows_the_rewrite(capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py:causal_attention")]) == 0
    out = capsys.readouterr().out
    assert "rewrite: saturated" in out and "flash-attention" in out and "causal-from-tril-mask" in out
    assert "flash_attention(q, k, v, causal=True" in out


def test_explain_weighs_candidates_and_says_why_one_won(capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py:attention"), "--arch", "A100"]) == 0
    out = capsys.readouterr().out
    assert "candidates on A100-SXM (sm_80" in out
    for label in ("fully fused", "epilogue-fused", "unfused"):
        assert f"candidate {['fully fused', 'epilogue-fused', 'unfused'].index(label)}: {label}" in out
    for column in ("regs", "smem KB", "occ", "HBM MB", "GFLOP", "est µs", "bound", "max regs"):
        assert column in out
    assert "chosen: fully fused" in out and "faster than the epilogue-fused runner-up" in out
    assert "flash_attention_bf16_d64" in out.split("generated kernels (sm_80")[1]


def test_explain_plans_for_the_arch_in_tessera_arch(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_ARCH", "L4")
    assert main(["--explain", str(ROOT / "examples/attention.py:attention")]) == 0
    assert "candidates on L4 (sm_89" in capsys.readouterr().out
    assert main(["--explain", str(ROOT / "examples/attention.py:attention"), "--arch", "nope"]) == 2
    assert "unknown architecture 'nope'" in capsys.readouterr().err


def test_explain_runs_the_plan_and_checks_it_against_the_reference(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    shape = "2x4x300x64:bf16"
    assert main(["--explain", str(ROOT / "examples/attention.py:causal_attention"), "--run",
                 "--input", f"q={shape}", "--input", f"k={shape}", "--input", f"v={shape}"]) == 0
    out = capsys.readouterr().out
    assert "0: b3:bf16[2,4,300,64] = flash_attention(" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("ran the plan"))
    assert "CPU (numpy executor)" in line
    error = float(line.rsplit("reference ", 1)[1].split()[0])
    assert 0 < error < 2e-2          # bf16 rounding of the fused plan vs the unfused reference


@pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler")
def test_a_run_in_the_emulator_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TESSERA_DEVICE", "emulator")
    source = tmp_path / "scaled.py"
    source.write_text("from tessera_rw import op\n\n@op.kernel\ndef scaled(x):\n    return op.exp(x) * 2.0\n")
    assert main(["--explain", f"{source}:scaled", "--run", "--input", "x=8x32:f32"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ran the plan"))
    assert "CPU emulator" in line


def test_a_plan_that_disagrees_with_its_reference_fails_the_run(capsys, monkeypatch):
    from tessera_rw.cli import plan_check
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    real = plan_check.run_program
    monkeypatch.setattr(plan_check, "run_program", lambda program, arrays: tuple(
        np.asarray(o) * 1.1 for o in real(program, arrays)))          # a plan 10% off
    shape = "1x2x64x64:bf16"
    assert main(["--explain", str(ROOT / "examples/attention.py:causal_attention"), "--run",
                 "--input", f"q={shape}", "--input", f"k={shape}", "--input", f"v={shape}"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: over the bound" in out and "causal_attention disagree with their unfused references" in out


def test_a_run_too_large_to_check_says_so_and_how_to_check_it(capsys, monkeypatch):
    from tessera_rw.cli import plan_check
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    monkeypatch.setattr(plan_check, "REFERENCE_LIMIT_BYTES", 1024)
    assert main(["--explain", str(ROOT / "examples/attention.py:attention"), "--run",
                 *(f"--input={n}=1x2x64x64:bf16" for n in "qkv")]) == 0
    line = " ".join(capsys.readouterr().out.split())
    assert "the reference check is skipped (the unfused graph needs 0.0 GiB and 0 GFLOP): give smaller --input " \
           "shapes to check the plan at them" in line


def test_tune_prints_the_config_then_a_second_run_comes_from_the_cache(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    target = "examples/attention.py:attention"
    shape = ["--input", "q=1x2x256x64:bf16", "--input", "k=1x2x256x64:bf16", "--input", "v=1x2x256x64:bf16"]
    assert main(["tune", target, *shape, "--method", "cost_model"]) == 0
    out = capsys.readouterr().out
    assert "Best config: tile=(" in out and "chosen by cost_model" in out and "% of best" in out
    assert main(["tune", target, *shape, "--method", "cost_model", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chosen_by"] == "cache" and report["kernels"][0]["kind"] == "flash_attention"
    assert report["fusion_depth"] == 2 and report["fusion"] == "fully fused"     # as explain's JSON has it


def test_explain_says_how_a_cached_choice_was_made_and_the_peaks_of_the_units_used(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert main(["--explain", "examples/matmul_autotune.py", "--tune"]) == 0     # @op.autotune: its own cache
    capsys.readouterr()
    assert main(["--explain", "examples/matmul_autotune.py"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "from the autotune cache: ranked by the cost model earlier for this signature" in text
    assert "989 bf16" in text and "fp8" not in text                            # the units its kernels run on


def test_tune_takes_a_file_of_one_kernel_and_asks_which_of_several(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert main(["tune", "examples/resnet_block.py", "--method", "cost_model"]) == 0
    assert "Best config: " in capsys.readouterr().out
    assert main(["tune", "examples/rotary_swiglu.py", "--method", "cost_model"]) == 2
    err = capsys.readouterr().err
    assert "makes 2 kernels (rotary_embedding, swiglu_mlp)" in err and "examples/rotary_swiglu.py:FUNCTION" in err


def test_tune_on_device_without_a_gpu_is_one_clear_line(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    from tessera_rw.codegen.device import gpu_available
    if gpu_available():
        pytest.skip("checks the behaviour without a GPU")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert main(["tune", "examples/attention.py:attention", "--input", "q=1x2x64x64:bf16", "--input",
                 "k=1x2x64x64:bf16", "--input", "v=1x2x64x64:bf16", "--method", "on_device"]) == 2
    err = capsys.readouterr().err
    assert "has none" in err and "cost_model" in err


@pytest.mark.parametrize("flag, value, says", [("--max-trials", "abc", "'abc' is not a positive integer"),
                                               ("--max-trials", "0", "0 is not a positive integer"),
                                               ("--time-budget", "soon", "'soon' is not a positive number")])
def test_tune_options_that_are_not_numbers_say_so(capsys, flag, value, says):
    from tessera_rw.cli import main
    assert main(["tune", "examples/matmul_autotune.py", flag, value]) == 2
    assert f"argument {flag}: {says}" in capsys.readouterr().err


def test_tune_for_another_arch_keeps_its_records_under_that_arch(tmp_path, monkeypatch, capsys):
    from tessera_rw.cli import main
    from tessera_rw.tune.cache import TuneCache
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    shape = ["--input", "q=1x2x256x64:bf16", "--input", "k=1x2x256x64:bf16", "--input", "v=1x2x256x64:bf16"]
    assert main(["tune", "examples/attention.py:attention", *shape, "--arch", "sm_80", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["arch"] == "A100-SXM" and report["chosen_by"] == "cost_model"   # no A100 here to time on
    assert {r.arch for r in TuneCache("default").records()} == {"A100-SXM"}
    assert main(["tune", "examples/attention.py:attention", *shape, "--arch", "B300"]) == 2
    assert "unknown architecture 'B300'" in capsys.readouterr().err


PINNED_MLP = '''
from tessera_rw import op

@op.kernel
def mlp(x, w1, w2):
    h = op.gelu(op.matmul(x, w1, tile_shape=(128, 128, 32)))
    return op.matmul(h, w2, tile_shape={second})

def example_inputs():
    return {{"x": op.tensor((1024, 768), "bf16"), "w1": op.tensor((768, 3072), "bf16"),
             "w2": op.tensor((3072, 768), "bf16")}}
'''


def test_explain_shows_the_pinned_tiles_and_refuses_one_the_kernel_cannot_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_ARCH", "H100-SXM")
    good, bad = tmp_path / "pinned.py", tmp_path / "badly_pinned.py"
    good.write_text(PINNED_MLP.format(second="(64, 64)"))
    bad.write_text(PINNED_MLP.format(second="(100, 64)"))
    assert main(["--explain", f"{good}:mlp"]) == 0
    out = capsys.readouterr().out
    assert "pinned: step 0 gemm runs 128x128x32" in out and "pinned: step 1 gemm runs 64x64x" in out
    assert main(["--explain", f"{bad}:mlp"]) == 2
    err = capsys.readouterr().err
    assert "tile_shape=(100, 64) on the 1024×768×3072 matmul" in err and "badly_pinned.py:7" in err


def test_emit_cuda_skips_a_host_only_function_and_writes_the_others(tmp_path, capsys):
    module = tmp_path / "mixed.py"
    module.write_text("import numpy as np\nfrom tessera_rw import op\n\n@op.kernel\ndef host_only(a, b):\n"
                      "    return op.gelu(a @ b)\n\n\ndef example_inputs():\n"
                      "    return {'a': np.ones((64, 32)), 'b': np.ones((32, 16))}\n")     # float64: no GPU template
    out = tmp_path / "cuda"
    assert main(["--explain", str(module), str(ROOT / "examples/attention.py:attention"), "--emit-cuda", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no CUDA written for host_only" in printed and "CUDA written to" in printed
    assert not (out / "host_only").exists() and len(list((out / "attention").glob("*.cu"))) == 1


def test_tune_writes_to_the_kernels_own_cache(tmp_path, monkeypatch, capsys):
    from tessera_rw.tune.cache import TuneCache
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert main(["tune", str(ROOT / "examples/matmul_autotune.py:linear_gelu"), "--method", "cost_model"]) == 0
    assert TuneCache("examples").records() and not TuneCache("default").records()     # @op.autotune(cache="examples")


CONTAINER_MODULE = '''
import numpy as np
from tessera_rw import op

@op.kernel
def mlp(p, x):
    h = op.relu(x @ p["w"] + p["b"])
    return h @ p["layers"][0]["w"]

def example_inputs():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {"p": {"w": f(16, 32), "b": f(32), "layers": [{"w": f(32, 8)}]}, "x": f(4, 16)}
'''


def test_explain_run_and_tune_take_a_function_whose_argument_is_a_dict(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    module = tmp_path / "container_mod.py"
    module.write_text(CONTAINER_MODULE)
    assert main(["--explain", str(module), "--run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "p.layers[0].w" in out and "max error vs the unfused reference" in out
    assert main(["tune", f"{module}:mlp", "--method", "cost_model"]) == 0
    assert "Best config" in capsys.readouterr().out


def test_a_report_names_the_kernel_as_the_module_does(tmp_path, capsys):
    # `dloss = op.grad(loss)` is the kernel grad_loss: the report says both, so either finds it
    module = tmp_path / "gradient_mod.py"
    module.write_text("from tessera_rw import op\n\ndef loss(x, w):\n    return op.sum((x @ w) ** 2)\n\n"
                      "dloss = op.grad(loss)\n")
    assert main(["--explain", f"{module}:dloss", "--input", "x=4x3:float32", "--input", "w=3x5:float32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dloss: the kernel grad_loss" and lines[1] == "grad_loss: input graph"


def test_a_file_whose_kernels_are_a_partial_and_a_callable_object_lists_both(tmp_path, capsys):
    module = tmp_path / "wrapped.py"
    module.write_text("import functools\nfrom tessera_rw import op\n"
                      "def scale(x, s):\n    return x * s\n"
                      "halve = op.kernel(functools.partial(scale, s=0.5))\n"
                      "class Double:\n    def __call__(self, x):\n        raise ValueError('boom in user code')\n"
                      "double = op.kernel(Double())\n"
                      "def example_inputs():\n    import numpy as np\n    return {'x': np.ones(4, np.float32)}\n")
    assert main(["--explain", f"{module}:halve"]) == 0
    assert main(["--explain", f"{module}:double"]) == 2
    err = capsys.readouterr().err
    assert "tracing Double raised ValueError: boom in user code" in err and "wrapped.py:8" in err
    only = tmp_path / "only_partial.py"
    only.write_text("import functools\nfrom tessera_rw import op\n"
                    "def scale(x, s):\n    return x * s\n"
                    "halve = op.kernel(functools.partial(scale, s=0.5))\n"
                    "def example_inputs():\n    import numpy as np\n    return {'x': np.ones(4, np.float32)}\n")
    assert main(["--explain", str(only)]) == 0          # found by its function's module, not functools'


def test_input_overrides_what_example_inputs_give_the_rest_come_from_them(tmp_path, capsys):
    module = tmp_path / "container_mod.py"
    module.write_text(CONTAINER_MODULE)
    assert main(["--explain", f"{module}:mlp", "--input", "x=2x16:bf16", "--input", "p.layers[0].w=32x4",
                 "--run"]) == 0
    out = capsys.readouterr().out
    assert "x: bf16[2,16]" in out and "p.layers[0].w: f32[32,4]" in out and "p.w: f32[16,32]" in out
    assert main(["--explain", f"{module}:mlp", "--input", "p.v=16x32"]) == 2
    assert "--input p.v: example_inputs() gives p the keys w, b, layers" in capsys.readouterr().err


def test_example_inputs_may_give_each_kernel_its_own_dict_by_the_kernels_name(tmp_path, capsys):
    module = tmp_path / "two_sizes.py"
    module.write_text("from tessera_rw import op\n"
                      "@op.kernel\ndef small(x, w):\n    return x @ w\n"
                      "@op.kernel\ndef big(x, w):\n    return x @ w\n"
                      "def example_inputs():\n"
                      "    return {'small': {'x': op.tensor((8, 16)), 'w': op.tensor((16, 4))},\n"
                      "            'large': {'x': op.tensor((512, 256)), 'w': op.tensor((256, 128))}}\n")
    assert main(["--explain", f"{module}:small"]) == 0
    assert "def small(x: f32[8,16], w: f32[16,4])" in capsys.readouterr().out
    assert main(["--explain", f"{module}:big"]) == 2
    assert "has no x, w (it gives small, large)" in capsys.readouterr().err


def test_input_names_an_array_inside_a_container_argument_by_its_path(tmp_path, capsys):
    module = tmp_path / "container_mod.py"
    module.write_text(CONTAINER_MODULE)
    given = ["--input", "p.w=16x32:bf16", "--input", "p.b=32:bf16", "--input", "p.layers[0].w=32x8:bf16",
             "--input", "x=4x16:bf16"]
    assert main(["--explain", f"{module}:mlp", *given]) == 0
    assert "p.layers[0].w: bf16[32,8]" in capsys.readouterr().out
    bare = tmp_path / "container_without_examples.py"
    bare.write_text(CONTAINER_MODULE.split("def example_inputs")[0])
    assert main(["--explain", f"{bare}:mlp", *given[:4], "--input", "p.layers[1].w=32x8:bf16", *given[6:]]) == 2
    assert "no --input for p.layers[0]" in capsys.readouterr().err
    assert main(["--explain", f"{bare}:mlp", *given[:2], "--input", "p.layers[0].w=32x8:bf16", *given[6:]]) == 2
    assert "raised KeyError: 'b'" in (err := capsys.readouterr().err) and "give it with --input, as --input p.b=" in err
    assert main(["--explain", f"{module}:mlp", "--input", "p..w=3"]) == 2
    assert "malformed --input" in capsys.readouterr().err


def test_what_a_module_prints_as_it_loads_goes_to_stderr_leaving_the_json_alone(tmp_path, capsys):
    module = tmp_path / "chatty.py"
    module.write_text("from tessera_rw import op\nprint('loading weights...')\n"
                      "@op.kernel\ndef double(x):\n    return x * 2.0\n")
    assert main(["--explain", f"{module}:double", "--input", "x=4", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["function"] == "double" and "loading weights..." in err


def test_a_file_explains_the_kernels_it_makes_from_other_modules_functions_not_those_it_imports(tmp_path, capsys):
    (tmp_path / "blocks_helper.py").write_text(
        "from tessera_rw import op\n"
        "def make_block():\n    def block(x, w):\n        return op.relu(x @ w)\n    return block\n"
        "@op.kernel\ndef imported_kernel(x, w):\n    return x @ w\n")
    (tmp_path / "blocks_made_elsewhere.py").write_text(
        "from tessera_rw import op\nimport blocks_helper\nelsewhere = op.kernel(blocks_helper.make_block())\n")
    module = tmp_path / "model_file.py"
    module.write_text("from tessera_rw import op\nimport blocks_helper\nfrom blocks_helper import imported_kernel\n"
                      "from blocks_made_elsewhere import elsewhere\n"
                      "block = op.kernel(blocks_helper.make_block())\nalias = block\n"
                      "@op.kernel\ndef own(x, w):\n    return x @ w + 1.0\n"
                      "def example_inputs():\n    import numpy as np\n"
                      "    return {'x': np.ones((4, 8), np.float32), 'w': np.ones((8, 3), np.float32)}\n")
    assert main(["--explain", str(module), "--format", "json"]) == 0
    names = [r["function"] for r in json.loads(capsys.readouterr().out)]
    assert names == ["block", "own"]


def test_a_kernel_without_example_inputs_is_told_the_command_that_gives_them(tmp_path, capsys):
    from tessera_rw.cli import main
    (tmp_path / "two.py").write_text("from tessera_rw import op\n\n@op.kernel\ndef f(x, y):\n    return x + y\n\n"
                                     "@op.kernel\ndef g(x):\n    return x * 2\n")
    assert main(["--explain", str(tmp_path / "two.py")]) == 2
    assert "--explain two.py:f --input x=DIMS:DTYPE --input y=DIMS:DTYPE, each DIMS" in capsys.readouterr().err
    assert main(["tune", f"{tmp_path / 'two.py'}:g"]) == 2
    assert "tessera-rewrite tune two.py:g --input x=DIMS:DTYPE" in capsys.readouterr().err
