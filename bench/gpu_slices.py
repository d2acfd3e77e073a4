"""The slice-and-join rows of `python -m bench gpu`: programs whose copies the plan reads in place.

- rotary embeddings, `x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`, on 4 sequences × 32 heads
  of 2048 tokens × 128 in bf16: one concatenated_elementwise kernel (lower/concat_reads.py);
- SwiGLU over a packed gate/up projection, `(silu(h[:, :f]) * h[:, f:]) @ W_down` with
  h = x W_gate_up, 4096 tokens of width 1024 into 2816: two gemms and one strided_elementwise
  reading the halves where the first gemm wrote them (lower/view_reads.py).

Ours is the `@op.kernel` call on torch CUDA tensors, as a user makes it (examples/rotary_swiglu.py's
kernels); torch runs the same expression eagerly. The floor is each input read once and the output
written once at the measured copy bandwidth (plus the gemms' FLOPs at the measured matmul rate).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.gpu import Ceilings
from bench.gpu_results import Result, error_line
from bench.gpu_timing import Protocol, rel_error, time_torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rotary_swiglu.py"
TOLERANCE = 1e-2            # bf16 results: ‖out − ref‖ / ‖ref‖
B, H, S, D = 4, 32, 2048, 128
TOKENS, WIDTH, HIDDEN = 4096, 1024, 2816


@dataclass(frozen=True)
class ProgramRow:
    name: str
    kernel: str                                   # the example's kernel
    make: Callable[[], tuple]                     # torch CUDA inputs
    torch_fn: Callable[..., object]
    reference: Callable[..., object]              # float64
    flops: float
    bytes: float


def _example():
    spec = importlib.util.spec_from_file_location("bench_rotary_swiglu", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rotate(x, cos, sin):
    import torch
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _swiglu(x, w_gate_up, w_down):
    import torch.nn.functional as F
    h = x @ w_gate_up
    return (F.silu(h[:, :HIDDEN]) * h[:, HIDDEN:]) @ w_down


def _randn(*shape, scale: float = 1.0):
    import torch
    return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)


def slice_rows() -> list[ProgramRow]:
    """The rows, their inputs made only when run.

    >>> [row.kernel for row in slice_rows()]
    ['rotary_embedding', 'swiglu_mlp']
    """
    rope_bytes = (2 * B * H * S * D + 2 * S * D) * 2
    swiglu_flops = 2 * TOKENS * WIDTH * 2 * HIDDEN + 2 * TOKENS * HIDDEN * WIDTH
    swiglu_bytes = (TOKENS * WIDTH * 2 + WIDTH * 2 * HIDDEN + HIDDEN * WIDTH) * 2
    return [
        ProgramRow(f"rotary embedding bf16 B={B} H={H} S={S} D={D} (one kernel) vs torch eager", "rotary_embedding",
                   lambda: (_randn(B, H, S, D), _randn(S, D), _randn(S, D)), _rotate,
                   lambda x, c, s: _rotate(x.double(), c.double(), s.double()), 0, rope_bytes),
        ProgramRow(f"SwiGLU bf16 {TOKENS}x{WIDTH}, hidden {HIDDEN} (halves read in place) vs torch eager",
                   "swiglu_mlp",
                   lambda: (_randn(TOKENS, WIDTH), _randn(WIDTH, 2 * HIDDEN, scale=WIDTH ** -0.5),
                            _randn(HIDDEN, WIDTH, scale=HIDDEN ** -0.5)),
                   _swiglu, lambda x, a, b: _swiglu(x.double(), a.double(), b.double()), swiglu_flops,
                   swiglu_bytes),
    ]


def slice_row_runs(protocol: Protocol, ceilings: Ceilings) -> list[tuple[str, Callable[[], Result]]]:
    """(name, run) per row, as `bench gpu` runs its library rows."""
    return [(row.name, lambda row=row: _run(row, protocol, ceilings)) for row in slice_rows()]


def _run(row: ProgramRow, protocol: Protocol, ceilings: Ceilings) -> Result:
    unit, work = ("TFLOP/s", row.flops) if row.flops else ("GB/s", row.bytes)
    result = Result(row.name, floor_ms=ceilings.floor_ms(row.flops, row.bytes), rate_unit=unit, work=work)
    try:
        import os
        os.environ["TESSERA_DEVICE"] = "gpu"
        kernel = getattr(_example(), row.kernel)
        inputs = row.make()
        ref = row.reference(*inputs)
        result.error = rel_error(kernel(*inputs), ref)
        result.torch_error = rel_error(row.torch_fn(*inputs), ref)
        del ref
        if result.error > TOLERANCE:
            result.status = "FAILED: wrong on random data"
            return result
        result.ours = time_torch(lambda: kernel(*inputs), protocol)
        result.torch = time_torch(lambda: row.torch_fn(*inputs), protocol)
        steps = [s.op for s in kernel.program(*inputs).plan.steps]
        result.notes.append("ours: the plan " + " -> ".join(steps))
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result
