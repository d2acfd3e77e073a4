"""What `python -m bench gpu` and `python -m bench tune` record: the machine they ran on (device,
driver, clocks read before and after the run, libraries), every row as a record, and the files
bench/results/<suite>-<device>-<date>.json and .md (results_files.write_results).

>>> from bench.gpu_timing import Timing
>>> r = Result("gemm", floor_ms=1.0, ours=Timing(1.25, 0.01), torch=Timing(1.0, 0.0), work=2e12, error=1e-3)
>>> row_cells(r)[1:9]
['1.000', '1.250 ±1%', '1.000 ±0%', '1,600', '2,000', 'TFLOP/s', '0.80', '80%']
>>> row_record(r)["ours_per_torch_speed"], passed(r.status), passed("FAILED: wrong")
(0.8, True, False)
>>> progress_line(r)
'  gemm: ok (ours 1.250 ms, torch 1.000 ms, ours/torch speed 0.80)'
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from rich.markup import escape
from rich.table import Table

from bench.gpu_timing import Timing
from bench.results_files import markdown_table, slug, write_results

COLUMNS = ("row", "floor ms", "ours ms", "torch ms", "ours", "torch", "unit", "ours/torch speed", "ours % of floor",
           "error ours / torch", "status")
_NOT_FAILED = ("owed", "not compared", "skipped")
_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "temperature.gpu", "pstate")


@dataclass
class Result:
    """One row: ours and the reference library's, timed in the same run, with the row's floor."""
    name: str
    status: str = "ok"
    floor_ms: float = 0.0
    ours: Timing | None = None
    torch: Timing | None = None
    rate_unit: str = "TFLOP/s"
    work: float = 0.0                          # FLOPs, or bytes for memory-bound rows
    error: float | None = None
    torch_error: float | None = None
    notes: list[str] = field(default_factory=list)


def error_line(e: BaseException, limit: int = 120) -> str:
    """'ValueError: the first line of its message', cut to `limit` characters of message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:limit] if str(e) else ''}"


def passed(status: str) -> bool:
    """A row that ran and checked out, or one that says why it was not compared."""
    return status == "ok" or status.startswith(_NOT_FAILED)


def _rate(r: Result, t: Timing | None) -> float | None:
    """TFLOP/s, or GB/s for memory-bound rows."""
    if t is None:
        return None
    per_s = r.work / (t.median_ms * 1e-3)
    return per_s / 1e9 if r.rate_unit == "GB/s" else per_s / 1e12


def _speed(r: Result) -> float | None:
    return r.torch.median_ms / r.ours.median_ms if r.ours and r.torch else None


def row_cells(r: Result) -> list[str]:
    """The row's cells under COLUMNS."""
    ours, ref = r.ours, r.torch
    rate = [f"{x:,.0f}" if x is not None else "" for x in (_rate(r, ours), _rate(r, ref))]
    speed = _speed(r)
    return [r.name, f"{r.floor_ms:.3f}", f"{ours.median_ms:.3f} ±{ours.spread:.0%}" if ours else "",
            f"{ref.median_ms:.3f} ±{ref.spread:.0%}" if ref else "", *rate, r.rate_unit,
            f"{speed:.2f}" if speed is not None else "", f"{100 * r.floor_ms / ours.median_ms:.0f}%" if ours else "",
            " / ".join("-" if e is None else f"{e:.1e}" for e in (r.error, r.torch_error)), r.status]


def progress_line(r: Result) -> str:
    """One finished row as the log shows it while the run goes on (a run stopped at its limit
    writes no results file, so its log is what is left)."""
    timing = (f"ours {r.ours.median_ms:.3f} ms" if r.ours else "") + (
        f", torch {r.torch.median_ms:.3f} ms, ours/torch speed {_speed(r):.2f}" if r.ours and r.torch else "")
    return f"  {r.name}: {r.status}" + (f" ({timing})" if timing else "")


def row_record(r: Result) -> dict:
    """The row for the JSON document: every number unrounded, with its unit."""
    speed = _speed(r)
    return {"row": r.name, "status": r.status, "floor_ms": r.floor_ms,
            "ours_ms": r.ours.median_ms if r.ours else None, "ours_spread": r.ours.spread if r.ours else None,
            "torch_ms": r.torch.median_ms if r.torch else None, "torch_spread": r.torch.spread if r.torch else None,
            "unit": r.rate_unit, "ours_rate": _rate(r, r.ours), "torch_rate": _rate(r, r.torch),
            "ours_per_torch_speed": None if speed is None else round(speed, 4),
            "ours_fraction_of_floor": r.floor_ms / r.ours.median_ms if r.ours else None,
            "error": r.error, "torch_error": r.torch_error, "notes": list(r.notes)}


def rich_table(results: Sequence[Result], title: str) -> Table:
    t = Table(title=title)
    for column in COLUMNS:
        t.add_column(column, justify="left" if column in ("row", "status", "unit") else "right")
    for r in results:
        t.add_row(*map(escape, row_cells(r)), style=None if passed(r.status) else "red")
    return t


def results_markdown(results: Sequence[Result]) -> str:
    notes = [f"- {r.name}: {note}" for r in results for note in r.notes]
    return markdown_table(COLUMNS, [row_cells(r) for r in results]) + ("\n\n" + "\n".join(notes) if notes else "")


def _measured_gpu() -> str:
    """nvidia-smi's name for the GPU the figures come from, CUDA's device 0: its UUID (nvidia-smi's
    indices follow PCI order and ignore CUDA_VISIBLE_DEVICES); "0" where torch cannot say."""
    try:
        import torch
        return f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    except Exception:
        return "0"


def nvidia_smi(fields: Sequence[str] = _SMI_FIELDS) -> dict[str, str]:
    """The measured GPU's `nvidia-smi --query-gpu` fields ({} where nvidia-smi is missing or fails)."""
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader",
                               "-i", _measured_gpu()], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    values = done.stdout.strip().split(", ")
    return dict(zip(fields, values)) if done.returncode == 0 and len(values) == len(fields) else {}


def gpu_machine() -> dict:
    """The device, its driver and clocks now, and the libraries the figures depend on."""
    import cuda.core
    import torch
    import tessera_rw
    from tessera_rw.codegen.arch import current_arch
    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30), "arch_spec": current_arch().name,
            "nvidia_smi_before": nvidia_smi(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_core": cuda.core.__version__, "tessera_rw": tessera_rw.__version__,
            "python": platform.python_version(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def machine_lines(machine: dict) -> list[str]:
    smi = machine.get("nvidia_smi_before", {})
    return [f"device: {machine['device']} ({machine['sms']} SMs, {machine['memory_gib']} GiB), arch spec "
            f"{machine['arch_spec']}, driver {smi.get('driver_version', '?')}, clocks at the start: SM "
            f"{smi.get('clocks.sm', '?')} (max {smi.get('clocks.max.sm', '?')}), memory {smi.get('clocks.mem', '?')}",
            f"torch {machine['torch']} (CUDA {machine['cuda']}), cuda.core {machine['cuda_core']}, "
            f"tessera_rw {machine['tessera_rw']}, python {machine['python']}",
            f"date: {machine['started']}"]


def save(suite: str, machine: dict, document: dict, markdown: str) -> tuple[Path, Path]:
    """bench/results/<suite>-<device>-<date>.json and .md; nvidia-smi is read again first, just
    after the last measurement (snapshots before and after the run, not a trace of the clocks
    during it)."""
    machine = {**machine, "nvidia_smi_after": nvidia_smi()}
    smi = machine["nvidia_smi_after"]
    after = (f"clocks at the end: SM {smi.get('clocks.sm', '?')}, memory {smi.get('clocks.mem', '?')}, "
             f"{smi.get('temperature.gpu', '?')} °C")
    text = "\n".join(f"{line}  " for line in machine_lines(machine) + [after]) + "\n\n" + markdown
    return write_results(f"{suite}-{slug(machine['device'])}", {"machine": machine, **document}, text)
