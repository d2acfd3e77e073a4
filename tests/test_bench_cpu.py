"""`python -m bench cpu`'s pieces at a small scale: each stage timed and its products counted, the
executor comparisons checked against their baselines, the results files written and read back."""

from __future__ import annotations

import json

import numpy as np

from bench import host_executor, models, results_files
from bench.pipeline_stages import run_model
from tessera_rw.codegen.arch import arch_named


def test_every_stage_of_a_model_is_timed_and_its_kernels_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    stages = run_model("resnet", lambda: models.resnet_stack(blocks=2, batch=2, channels=16, size=12),
                       arch_named("H100-SXM"), reps=1)
    assert stages.graph_nodes > 10 and stages.enodes >= stages.eclasses > 0 and stages.kernels >= 4
    assert 1 <= stages.distinct_sources <= stages.kernels and len(stages.register_errors) == stages.distinct_sources
    assert all(t > 0 for t in (stages.trace_s, stages.saturate_s, stages.extract_s, stages.lower_s, stages.emit_s,
                               stages.compile_s))
    assert max(abs(e) for e in stages.register_errors) <= 0.25 and stages.spills == 0


def test_a_model_with_fft_steps_counts_them_as_library_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    stages = run_model("hyena", lambda: models.hyena_block(batch=1, seq=4096, width=32), arch_named("H100-SXM"), reps=1)
    assert stages.library_steps == 3 and stages.distinct_sources > 0


def test_blockwise_attention_holds_less_memory_than_the_naive_form_and_agrees_with_it():
    v = host_executor.attention_versus_naive(heads=1, seq=512, dim=32, reps=1)
    assert v.plan == "flash_attention" and v.max_rel_error < 1e-2      # bf16 outputs
    assert 0 < v.ours_peak < v.baseline_peak and v.ours_s > 0 and v.baseline_s > 0


def test_the_fft_convolution_agrees_with_scipy():
    direct, fft = host_executor.conv_versus_scipy(channels=2, seq=1024, reps=1)
    assert direct.max_rel_error < 1e-5 and fft.max_rel_error == direct.max_rel_error
    assert direct.ours_s == fft.ours_s and "scipy direct" in direct.what


def test_the_scipy_baselines_compute_the_causal_convolution():
    rng = np.random.default_rng(0)
    z, filt = rng.standard_normal((2, 3, 40)), rng.standard_normal((3, 1, 40))
    by_loop = np.zeros_like(z)
    for t in range(40):      # y[t] = Σ_j filt[j] z[t - 39 + j]
        for j in range(40 - t - 1, 40):
            by_loop[..., t] += filt[:, 0, j] * z[..., t - 39 + j]
    np.testing.assert_allclose(host_executor.scipy_direct(z, filt), by_loop, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(host_executor.scipy_fft(z, filt), by_loop, rtol=1e-9, atol=1e-9)


def test_results_are_written_as_json_and_markdown(tmp_path, monkeypatch):
    monkeypatch.setattr(results_files, "RESULTS", tmp_path)
    table = results_files.markdown_table(["a", "b"], [["1", "2"]])
    json_path, md_path = results_files.write_results("cpu-test", {"figures": [{"name": "x", "value": 1.0}]}, table)
    document = json.loads(json_path.read_text())
    assert document["schema"] == results_files.SCHEMA and document["figures"][0]["value"] == 1.0
    assert document["commit"] and json_path.stem == md_path.stem and json_path.stem.startswith("cpu-test-")
    assert md_path.read_text().splitlines()[2:] == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    assert results_files.slug("AMD EPYC 7B13 (x86_64)") == "AMD-EPYC-7B13-x86-64"
