"""What `python -m bench gpu` writes, from rows made up here (no GPU): bench/results/<suite>-<device>-
<date>.json with every number and the machine's driver and clocks, and the .md with the same table."""

from __future__ import annotations

import json

import pytest

from bench import gpu_results, results_files
from bench.gpu_results import Result, passed, results_markdown, row_record, save
from bench.gpu_timing import Timing

MACHINE = {"device": "NVIDIA H200", "sms": 132, "memory_gib": 140, "arch_spec": "H200",
           "nvidia_smi_before": {"driver_version": "580.159.04", "clocks.sm": "345 MHz", "clocks.max.sm": "1980 MHz",
                                 "clocks.mem": "3201 MHz"},
           "torch": "2.11.0", "cuda": "13.0", "cuda_core": "1.2.2", "tessera_rw": "0.1.0", "python": "3.12.3",
           "started": "2026-11-26 00:12 UTC"}


def rows() -> list[Result]:
    gemm = Result("gemm bf16 4096^3 vs torch.matmul", floor_ms=0.174, ours=Timing(0.199, 0.0),
                  torch=Timing(0.176, 0.01), work=2 * 4096 ** 3, error=1.7e-3, torch_error=1.7e-3,
                  notes=["schedule tma bm=128 bn=256"])
    softmax = Result("softmax bf16 8192x8192", floor_ms=0.075, ours=Timing(0.094, 0.0), torch=Timing(0.257, 0.0),
                     rate_unit="GB/s", work=2 * 8192 * 8192 * 2)
    owed = Result("long conv1d", status="owed: needs the plan runtime", rate_unit="GB/s")
    wrong = Result("attention", status="FAILED: 1 of 4 schedules wrong on random data")
    return [gemm, softmax, owed, wrong]


def test_rows_become_records_and_a_markdown_table():
    gemm, softmax, owed, wrong = rows()
    record = row_record(gemm)
    assert record["ours_per_torch_speed"] == round(0.176 / 0.199, 4)
    assert abs(record["ours_rate"] - 2 * 4096 ** 3 / 0.199e-3 / 1e12) < 1e-9 and record["unit"] == "TFLOP/s"
    assert abs(row_record(softmax)["ours_rate"] - 2 * 8192 * 8192 * 2 / 0.094e-3 / 1e9) < 1e-6
    assert row_record(owed)["ours_ms"] is None and passed(owed.status) and not passed(wrong.status)
    table = results_markdown(rows())
    assert table.splitlines()[0].startswith("| row | floor ms | ours ms |")
    assert "| 0.88 |" in table and "- gemm bf16 4096^3 vs torch.matmul: schedule tma bm=128 bn=256" in table


def test_the_files_name_the_device_and_date_and_record_driver_and_clocks(tmp_path, monkeypatch):
    monkeypatch.setattr(results_files, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_results, "nvidia_smi", lambda: {"clocks.sm": "1980 MHz", "clocks.mem": "3201 MHz",
                                                            "temperature.gpu": "52"})
    document = {"suite": "gpu", "rows": [row_record(r) for r in rows()]}
    json_path, md_path = save("gpu", MACHINE, document, results_markdown(rows()))
    assert json_path.name.startswith("gpu-NVIDIA-H200-") and json_path.suffix == ".json"
    saved = json.loads(json_path.read_text())
    assert saved["schema"] == "tessera_rw.bench/1" and saved["commit"]
    assert saved["machine"]["nvidia_smi_before"]["driver_version"] == "580.159.04"
    assert saved["machine"]["nvidia_smi_after"]["clocks.sm"] == "1980 MHz"
    assert [r["row"] for r in saved["rows"]] == [r.name for r in rows()]
    text = md_path.read_text()
    assert "driver 580.159.04" in text and "clocks at the end: SM 1980 MHz" in text
    assert "| gemm bf16 4096^3 vs torch.matmul |" in text


def test_a_whole_run_on_stand_ins_writes_every_row(tmp_path, monkeypatch):
    """bench gpu's run() with the device work replaced: the orchestration, the table and the files."""
    import io

    from rich.console import Console

    from bench import gpu, gpu_backward, gpu_conv, gpu_fftconv, gpu_slices
    from tessera_rw.codegen import arch as arch_module
    monkeypatch.setattr(results_files, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu, "preflight", lambda: None)
    monkeypatch.setattr(gpu, "copy_bandwidth", lambda nbytes, protocol: 4.2e12)
    monkeypatch.setattr(gpu, "matmul_rate", lambda n, protocol: 7.9e14)
    monkeypatch.setattr(gpu, "gpu_machine", lambda: dict(MACHINE))
    monkeypatch.setattr(gpu_results, "nvidia_smi", lambda: {})
    monkeypatch.setattr(gpu, "precompile", lambda kernels, arch: None)
    monkeypatch.setattr(gpu, "run_row", lambda row, protocol, ceilings, quick: Result(
        row.name, floor_ms=1.0, ours=Timing(1.1, 0.0), torch=Timing(1.0, 0.0), work=row.flops or row.bytes,
        rate_unit="GB/s" if row.flops == 0 else "TFLOP/s"))
    monkeypatch.setattr(gpu, "versus_compiled", lambda row, ours, protocol: Result(row.name + " vs torch.compile"))
    monkeypatch.setattr(gpu, "call_overheads", lambda: {"warm_call_us": 30.0, "plan_run_us": 28.0, "line": "calls"})
    monkeypatch.setattr(gpu_fftconv, "long_conv", lambda protocol, ceilings: Result("long conv", status="owed: x"))
    monkeypatch.setattr(gpu_conv, "conv_rows", lambda protocol, ceilings: [
        ("resnet", lambda: Result("resnet", ours=Timing(1.0, 0.0), torch=Timing(1.5, 0.0)))])
    monkeypatch.setattr(gpu_backward, "backward_rows", lambda protocol, ceilings, quick: [
        ("attention bwd", lambda: Result("attention bwd", ours=Timing(2.0, 0.0), torch=Timing(1.0, 0.0)))])
    monkeypatch.setattr(gpu_slices, "slice_row_runs", lambda protocol, ceilings: [
        ("rotary", lambda: Result("rotary", ours=Timing(0.5, 0.0), torch=Timing(1.0, 0.0)))])
    monkeypatch.setattr(arch_module, "current_arch", lambda: arch_module.arch_named("H200"))
    out = io.StringIO()
    assert gpu.run(quick=True, console=Console(file=out, width=240)) == 0
    [json_path] = tmp_path.glob("gpu-quick-NVIDIA-H200-*.json")
    saved = json.loads(json_path.read_text())
    names = [r["row"] for r in saved["rows"]]
    assert names[0].startswith("gemm bf16 4096^3") and names[-4:] == ["long conv", "resnet", "attention bwd", "rotary"]
    assert any(n.endswith("vs torch.compile") for n in names) and saved["calls"]["warm_call_us"] == 30.0
    assert saved["protocol"] == {"warmup": 3, "reps": 10, "flush_bytes": 2 * arch_module.arch_named("H200").l2_bytes}
    assert "tessera_rw vs torch on H200" in out.getvalue()
    assert json_path.with_suffix(".md").read_text().count("\n| ") == len(names) + 1
    assert "  attention bwd: ok (ours 2.000 ms, torch 1.000 ms, ours/torch speed 0.50)" in out.getvalue()

    # --only: the rows whose name holds the text, in a file of their own
    assert gpu.run(quick=True, console=Console(file=io.StringIO(), width=240), only="bwd") == 0
    [only_path] = tmp_path.glob("gpu-quick-only-bwd-NVIDIA-H200-*.json")
    assert [r["row"] for r in json.loads(only_path.read_text())["rows"]] == ["attention bwd"]


def test_the_resnet_rows_run_the_plans_they_name():
    """The block is two fused_conv kernels, and its training step copies no activation (at small
    sizes: the plans, not the timings, are what the rows assert before timing)."""
    from bench.gpu_conv import _loss, resnet_block
    from tessera_rw import op
    act, weight, bias = (2, 8, 6, 6), (8, 8, 3, 3), (8, 1, 1)
    params = [op.tensor(s, "bf16") for s in (act, weight, bias, weight, bias)]
    assert [k.op.op for k in resnet_block.program(*params).candidate.kernels] == ["fused_conv"] * 2
    steps = op.grad(_loss, argnums=(0, 1, 2, 3, 4)).program(*params, op.tensor(act, "bf16")).plan.steps
    assert [s.op for s in steps].count("strided_conv") == 4 and "transpose" not in [s.op for s in steps]


@pytest.fixture
def tuning_stand_ins(tmp_path, monkeypatch):
    """bench tune's run() with the device work replaced; the folder its results go to."""
    from bench import gpu_tuning
    from tessera_rw.codegen import arch as arch_module
    monkeypatch.setattr(results_files, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_tuning, "preflight", lambda: None)
    monkeypatch.setattr(gpu_tuning, "gpu_machine", lambda: dict(MACHINE))
    monkeypatch.setattr(gpu_results, "nvidia_smi", lambda: {})
    monkeypatch.setattr(arch_module, "current_arch", lambda: arch_module.arch_named("H200"))
    monkeypatch.setattr(gpu_tuning, "tuned_vs_default", lambda row, arch, protocol, root, quick: [
        row.name, "235.0", "192.0", "1.22x", "155.0", "0.81", "16/34", "2.0 s", "cache (3.0 ms)", "wg bm=128"])
    monkeypatch.setattr(gpu_tuning, "record_log", lambda name, op, arch, console: f"{name}: 34 schedules")
    monkeypatch.setattr(gpu_tuning, "sweep", lambda name, op, arch, variants: [f"  {name} [rows=64]: 145.6 µs"])
    return tmp_path


def _tune(**options) -> int:
    import io

    from rich.console import Console

    from bench import gpu_tuning
    return gpu_tuning.run(console=Console(file=io.StringIO(), width=240), **options)


def test_a_whole_tuning_run_on_stand_ins_writes_its_tables(tuning_stand_ins):
    assert _tune(quick=True) == 0
    [json_path] = tuning_stand_ins.glob("tune-quick-NVIDIA-H200-*.json")
    saved = json.loads(json_path.read_text())
    assert [t["speed-up"] for t in saved["tuned"]] == ["1.22x", "1.22x"]
    assert saved["timing_logs"] == ["gemm-bf16-2048: 34 schedules", "attention-bf16-s2048-d64: 34 schedules"]
    assert len(saved["sweeps"]) == 8 and "| kernel | default µs |" in json_path.with_suffix(".md").read_text()
    assert [line.split(" [")[0] for line in saved["sweeps"][:4]] == [
        "gemm bf16 4096^3 variants", "gemm bf16 8192x4096x1024 variants",
        "flash_attention fwd bf16 B=4 H=16 S=2048 D=64 variants",
        "flash_attention fwd bf16 B=4 H=16 S=2048 D=128 causal variants"]
    assert saved["not_reached"] == []


def test_a_tuning_run_stopped_in_its_sweeps_keeps_the_tuned_rows_and_logs(tuning_stand_ins, monkeypatch):
    from bench import gpu_tuning

    def stopped(name, op, arch, variants):
        raise KeyboardInterrupt        # the run stopped here
    monkeypatch.setattr(gpu_tuning, "sweep", stopped)
    with pytest.raises(KeyboardInterrupt):
        _tune(quick=True)
    [json_path] = tuning_stand_ins.glob("tune-quick-NVIDIA-H200-*.json")
    saved = json.loads(json_path.read_text())
    assert len(saved["tuned"]) == 2 and len(saved["timing_logs"]) == 2
    assert saved["sweeps"] == [] and saved["not_reached"] == ["schedule sweeps"]
    assert "schedule sweeps: not reached" in json_path.with_suffix(".md").read_text()


def test_a_tuning_run_on_some_kernels_takes_only_theirs(tuning_stand_ins):
    assert _tune(quick=False, only="gemm") == 0
    [json_path] = tuning_stand_ins.glob("tune-only-gemm-NVIDIA-H200-*.json")
    saved = json.loads(json_path.read_text())
    assert len(saved["tuned"]) == 4 and all(t["kernel"].startswith("gemm") for t in saved["tuned"])
    assert [line.split(":")[0] for line in saved["timing_logs"]] == ["gemm-bf16-2048", "gemm-bf16-4096"]
    assert [line.split(" [")[0] for line in saved["sweeps"]] == ["gemm bf16 4096^3 variants",
                                                                "gemm bf16 8192x4096x1024 variants"]
