"""ExplainReport: `kernel.explain` and `tessera-rewrite --explain --format json` give exactly the
tessera_rw.explain/1 schema; the text reads at 100 columns; --emit-cuda writes compilable kernels."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.cli import main
from tessera_rw.explain_report import ExplainReport, ReportError, kernel_info

ROOT = Path(__file__).resolve().parents[1]

SCHEMA_KEYS = {"schema", "function", "inputs", "egraph", "rules", "candidates", "chosen", "chosen_by"}
EGRAPH_KEYS = {"iterations", "enodes", "eclasses", "seconds", "stop_reason"}
CANDIDATE_KEYS = {"fusion_depth", "hbm_bytes", "flops", "est_us", "kernels"}
KERNEL_KEYS = {"kind", "fused", "hbm_bytes", "flops", "registers", "smem_bytes", "est_us"}
KINDS = {"gemm", "flash_attention", "softmax", "layernorm", "reduction", "elementwise", "fft", "ifft", "conv", "copy"}


def assert_schema(document: dict) -> None:
    """Exactly the keys the tessera_rw.explain/1 schema names, at every level, with values of the right sort."""
    assert set(document) == SCHEMA_KEYS and document["schema"] == "tessera_rw.explain/1"
    assert set(document["egraph"]) == EGRAPH_KEYS
    assert document["egraph"]["stop_reason"] in ("saturated", "iteration_limit", "node_limit", "time_limit")
    assert all(set(i) == {"name", "shape", "dtype"} for i in document["inputs"])
    assert all(set(r) == {"name", "ruleset", "matches"} and r["matches"] > 0 for r in document["rules"])
    for c in document["candidates"]:
        assert set(c) == CANDIDATE_KEYS and c["fusion_depth"] in (0, 1, 2)
        assert all(set(k) == KERNEL_KEYS and isinstance(k["fused"], list) for k in c["kernels"])
        assert all(k["kind"] in KINDS for k in c["kernels"]), [k["kind"] for k in c["kernels"]]
    assert 0 <= document["chosen"] < len(document["candidates"])
    assert document["chosen_by"] in ("cost_model", "on_device", "cache")
    ExplainReport.model_validate(document)


@op.kernel
def attention(q, k, v):
    s = (q @ k.mT) * (q.shape[-1] ** -0.5)
    return op.softmax(s, axis=-1) @ v


@pytest.fixture(scope="module")
def report() -> ExplainReport:
    spec = op.tensor((2, 8, 512, 64), "bf16")
    return attention.explain(spec, spec, spec)


def test_kernels_without_a_template_report_a_kind_of_the_vocabulary():
    @op.kernel
    def mixed(q, x):                 # float64: no GPU template for any of it
        a = op.softmax((q @ q.mT) * 0.1, axis=-1) @ q
        return op.sum(a, axis=-1) + op.sum(op.irfft(op.rfft(x) * 2.0, n=x.shape[-1]), axis=-1)[:, None, None]

    spec = op.tensor((2, 4, 32, 16), "float64")
    document = json.loads(mixed.explain(spec, op.tensor((2, 64), "float64")).to_json())
    assert_schema(document)
    kinds = {k["kind"] for c in document["candidates"] for k in c["kernels"]}
    assert {"gemm", "fft", "ifft"} <= kinds          # assert_schema holds each to the vocabulary


@pytest.mark.parametrize("dtype, head, says", [
    ("float32", 64, "q is float32: float32 attention runs as GEMM + softmax + GEMM (cast q, k and v to bf16"),
    ("bf16", 40, "head dims that are multiples of 16 up to 128, or 256, with v's equal to q's; here q's is 40")])
def test_explain_says_why_attention_stays_unfused(dtype, head, says):
    from tessera_rw.report import unbuildable_lines
    attention = op.kernel(lambda q, k, v: op.softmax(q @ k.mT * 0.125, axis=-1) @ v)
    spec = op.tensor((1, 2, 256, head), dtype)
    report = attention.explain(spec, spec, spec)
    assert [c.fusion_depth for c in report.candidates] == [1, 0]         # epilogue-fused, unfused
    lines = unbuildable_lines(report.program)
    assert len(lines) == 1 and says in lines[0]
    assert lines[0].startswith(f"flash_attention {spec.type}: the rewrites reached it, but no candidate can use it: "
                               "the fused attention kernel")
    assert "no candidate can use it" in " ".join(str(report).split())


def test_explain_says_a_softmax_over_a_middle_axis_is_not_a_row_kernels():
    from tessera_rw.report import unbuildable_lines
    softmax = op.kernel(lambda x: op.softmax(x * 2.0, axis=1))
    lines = unbuildable_lines(softmax.explain(op.tensor((8, 256, 64), "bf16")).program)
    assert lines and all("normalizes rows along the trailing axes, not the axes of" in line for line in lines)
    assert not [line for line in lines if "does not take" in line]


def test_an_unfused_plan_whose_chains_lowering_merged_says_so():
    from tessera_rw.report import choice_reason
    gate = op.kernel(lambda a, b: op.silu(a) * b)
    spec = op.tensor((256, 512), "bf16")
    report = gate.explain(spec, spec)
    assert len(report.candidates) == 1 and report.candidates[0].fusion_depth == 0
    assert choice_reason(report).startswith("chosen: the only candidate (unfused, its elementwise kernels merged)")
    plain = op.kernel(lambda a: op.exp(a)).explain(spec)
    assert choice_reason(plain).startswith("chosen: the only candidate (unfused), ")


def test_explain_of_fused_attention_has_no_refusal(report):
    from tessera_rw.report import unbuildable_lines
    assert report.candidates[0].fusion_depth == 2 and unbuildable_lines(report.program) == []


def test_kernel_explain_reports_the_fusion(report):
    assert report.function == "attention" and [i.name for i in report.inputs] == ["q", "k", "v"]
    assert report.inputs[0].shape == (2, 8, 512, 64) and report.inputs[0].dtype == "bfloat16"
    chosen = report.candidates[report.chosen]
    assert [k.kind for k in chosen.kernels] == ["flash_attention"] and chosen.fusion_depth == 2
    assert chosen.kernels[0].fused == ("scale", "softmax")
    assert chosen.flops == chosen.kernels[0].flops > 2 * 2 * 8 * 512 * 512 * 64
    assert {(r.ruleset, r.name) for r in report.rules} >= {("attention", "flash-attention-unmasked")}
    assert report.egraph.stop_reason == "saturated" and report.egraph.eclasses <= report.egraph.enodes
    assert report.chosen_by == "cost_model"
    assert len({c.fusion_depth for c in report.candidates}) == len(report.candidates) > 1


def test_json_is_exactly_the_schema_and_round_trips(report):
    document = json.loads(report.to_json())
    assert_schema(document)
    again = ExplainReport.from_json(report.to_json())
    assert again == report and again.program is None
    assert report.to_dict() == document and ExplainReport.from_json(report.to_dict()) == report


@pytest.mark.parametrize("change", [
    lambda d: d.update(schema="tessera_rw.explain/2"),
    lambda d: d.update(extra=1),
    lambda d: d.update(chosen=7),
    lambda d: d.update(chosen_by="luck"),
    lambda d: d["egraph"].update(stop_reason="bored"),
    lambda d: d["candidates"][0]["kernels"][0].pop("registers"),
])
def test_a_document_off_the_schema_is_rejected(report, change):
    document = json.loads(report.to_json())
    change(document)
    with pytest.raises(ReportError, match="not a tessera_rw.explain/1 report: "):
        ExplainReport.from_json(json.dumps(document))
    with pytest.raises(ReportError):
        ExplainReport.from_json(document)


def test_a_report_reads_from_a_dict_and_a_list_of_them_from_all_from_json(report):
    document = json.loads(report.to_json())
    assert ExplainReport.from_json(document) == report
    assert ExplainReport.all_from_json(json.dumps([document, document])) == (report, report)
    assert ExplainReport.all_from_json(document) == (report,)
    with pytest.raises(ReportError, match="a list of 2 reports(.|\n)*all_from_json"):
        ExplainReport.from_json([document, document])
    with pytest.raises(ReportError, match="not JSON"):
        ExplainReport.from_json("{")


def test_text_reads_at_100_columns(report):
    text = str(report)
    for section in ("attention: input graph", "rewrite: saturated", "candidates on", "candidate 0: fully fused",
                    "chosen: fully fused", "plan attention", "generated kernels"):
        assert section in text
    assert max(len(ln) for ln in text.splitlines() if not listing(ln)) <= 100
    assert all(ln == ln.rstrip() for ln in text.splitlines())


LISTING = re.compile(r"^(def |    |  return |plan |\s+\d+: |\s+b\d+ )")


def listing(line: str) -> bool:
    """Whether `line` belongs to a program listing (a graph or a plan), which prints one line per line."""
    return bool(LISTING.match(line))


def test_a_report_read_back_from_json_still_prints(report):
    text = str(ExplainReport.from_json(report.to_json()))
    assert "attention(q: bfloat16[2, 8, 512, 64]" in text and "candidate 0: fully fused" in text
    assert "chosen: fully fused" in text


def test_a_kernel_without_a_gpu_template_is_named_and_its_unknown_time_is_null(report):
    @op.kernel
    def f(x):
        return x @ x

    plain = f.explain(np.ones((8, 8)))                     # float64 matmul: the numpy executor only
    assert_schema(json.loads(plain.to_json()))
    text = str(plain)
    assert "gemm (no template: matmul)" in text and "generated kernels: none for the GPU" in text
    fused = report.program.candidate.kernels[0]           # a fused op no template has costs infinity
    assert kernel_info(replace(fused, est_us=math.inf)).est_us is None


def test_cli_json_is_one_document_per_function(capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py:attention"), "--format", "json",
                 "--input", "q=2x4x256x64:bf16", "--input", "k=2x4x256x64:bf16", "--input", "v=2x4x256x64:bf16"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert_schema(document)
    assert document["inputs"][0] == {"name": "q", "shape": [2, 4, 256, 64], "dtype": "bfloat16"}


def test_cli_explains_every_kernel_of_a_file(capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py"), "--format", "json"]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert [d["function"] for d in documents] == ["attention", "causal_attention", "sliding_window_attention"]
    for d in documents:
        assert_schema(d)


def test_cli_emits_cuda_that_compiles(tmp_path, capsys):
    assert main(["--explain", str(ROOT / "examples/attention.py:causal_attention"), "--emit-cuda", str(tmp_path),
                 "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    files = sorted((tmp_path / "causal_attention").glob("*.cu"))
    assert len(files) == 1 and files[0].name.startswith("00_flash_attention_wg_bf16_d64_causal_bm")   # sm_90: wgmma
    source = files[0].read_text()
    assert files[0].stem[3:] + "(" in source and "typedef" in source  # the prelude included: compiles alone
    row = next(ln for ln in out.splitlines() if files[0].name in ln).split()
    registers, spills = int(row[1]), int(row[2])
    assert 64 <= registers <= 255 and spills == 0


@pytest.mark.parametrize("registers, marked", [(72, True), (255, False)])
def test_a_spill_below_the_register_ceiling_is_marked_as_ptxas_trading_for_occupancy(tmp_path, monkeypatch, capsys,
                                                                                    registers, marked):
    from dataclasses import replace

    from tessera_rw.cli import explain as explain_cli

    def spilling(program, directory):       # as ptxas compiles a 128-thread tile at 72 registers on sm_90
        return [(k, path, replace(facts, registers=registers, spill_stores=4, spill_loads=4))
                for k, path, facts in emit_cuda(program, directory)]
    emit_cuda = explain_cli.emit_cuda
    monkeypatch.setattr(explain_cli, "emit_cuda", spilling)
    assert main(["--explain", str(ROOT / "examples/matmul_autotune.py"), "--emit-cuda", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("00_"))
    assert row.split()[2] == ("8*" if marked else "8")
    assert ("ptxas's own trade" in out) is marked


def test_cli_emits_the_generated_kernels_of_a_plan_with_library_steps(tmp_path, monkeypatch, capsys):
    from tessera_rw.codegen import library_kernels
    monkeypatch.setattr(library_kernels, "library_available", lambda name: False)   # as without nvmath-python
    assert main(["--explain", str(ROOT / "examples/hyena_conv.py"), "--emit-cuda", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("cuFFT ") == 3 and "none for the GPU" not in out
    written = sorted(p.name[:2] for p in (tmp_path / "hyena_block").glob("*.cu"))
    assert written == ["00", "01", "02", "05", "07", "08"]   # every step but the 3 cuFFT calls


def test_cli_tune_without_a_gpu_chooses_by_the_cost_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    args = ["--explain", str(ROOT / "examples/attention.py:attention"), "--tune", "--format", "json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert_schema(first)
    assert first["chosen_by"] == "cost_model"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["chosen_by"] == "cache"     # the second run asks the cache


def test_cli_without_tune_explains_what_a_call_would_take_from_the_kernels_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    target = str(ROOT / "examples/matmul_autotune.py:linear_gelu")
    assert main(["--explain", target, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen_by"] == "cost_model"
    assert not list((tmp_path / "autotune").rglob("*.json"))     # explaining tuned nothing into a cache
    assert main(["--explain", target, "--tune", "--format", "json"]) == 0
    capsys.readouterr()
    written = {p: p.read_bytes() for p in tmp_path.rglob("*.json")}
    assert written
    assert main(["--explain", target, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen_by"] == "cache"     # the kernel's @op.autotune cache
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.json")} == written


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_example_explains_to_the_schema(capsys):
    assert main(["--explain", *map(str, EXAMPLES), "--format", "json"]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert len(documents) >= len(EXAMPLES) >= 5
    for document in documents:
        assert_schema(document)


def test_every_example_reads_at_100_columns(capsys):
    assert main(["--explain", *map(str, EXAMPLES)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(ln) for ln in lines if not listing(ln)) <= 100
    assert all(ln == ln.rstrip() for ln in lines)
    # a graph line is whole, its type comment on it: `    t3 = softmax(t2, axis=3)   # bf16[…]`
    assert all("#" in ln for ln in lines if re.match(r"^    t\d+ = ", ln))
    assert sum(ln.startswith("chosen: ") for ln in lines) >= len(EXAMPLES)
    assert not any("…" in ln for ln in lines)


def test_a_long_kernel_name_folds_and_leaves_its_launch_readable():
    """A TMA gemm's 60-character name once squeezed the grid column to "5…" at 100 columns."""
    report = op.kernel(lambda x, w: x @ w).explain(op.tensor((4096, 4096), "bf16"), op.tensor((4096, 4096), "bf16"))
    text = report.render(width=100)
    kernel = next(k for k in text.split("generated kernels")[1].splitlines() if "gemm_bf16" in k)
    assert kernel.split()[2:4] == ["512", "384"], kernel


def test_zero_size_tensors_explain_and_run():
    attention = op.kernel(lambda q, k, v: op.softmax(q @ k.mT * 0.125, axis=-1) @ v)
    t = op.tensor((0, 4, 128, 64), "bf16")
    report = attention.explain(t, t, t)
    assert all(c.est_us < float("inf") for c in report.candidates)
    q = np.zeros((0, 4, 128, 64), np.float32)
    assert attention(q, q, q).shape == (0, 4, 128, 64)
    np.testing.assert_array_equal(op.kernel(lambda x: op.sum(x, axis=0))(np.zeros((0, 3), np.float32)), np.zeros(3))


def test_a_rule_that_assumes_something_of_the_values_says_so_when_it_fires():
    def attention(fill):
        def body(q, k, v):
            s = op.where(op.tril(op.ones((64, 64), dtype="bool")), q @ k.mT, fill)
            return op.softmax(s, axis=-1) @ v
        return op.kernel(body)

    spec = op.tensor((2, 64, 32), "bf16")
    text = " ".join(str(attention(-1e4).explain(spec, spec, spec)).split())
    assert ("attention/causal-fill-is-neg-inf assumes that each row of the causal mask's scores holds a kept score "
            "above its finite fill + 104") in text
    plain = op.kernel(lambda q, k, v: op.softmax(q @ k.mT, axis=-1) @ v)
    assert " assumes " not in " ".join(str(plain.explain(spec, spec, spec)).split())
    exact = attention(float("-inf")).explain(spec, spec, spec)          # −∞ takes the exact rules
    assert " assumes " not in " ".join(str(exact).split())
    assert [k.kind for k in exact.candidates[exact.chosen].kernels] == ["flash_attention"]


def test_the_choice_between_the_fft_and_direct_convolution_is_stated(capsys):
    from tessera_rw.cli import main
    assert main(["--explain", "examples/hyena_conv.py"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"chosen: \S+, FFT, [\d.]+ µs by the cost model, .*; the best \S+, direct conv candidate takes "
                     r"[\d.]+ µs", text)
