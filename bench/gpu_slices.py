"""The slice-and-join rows of `python -m bench gpu`: programs whose copies the plan reads in place.

- rotary embeddings, `x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`, on 4 sequences × 32 heads
  of 2048 tokens × 128 in bf16: one concatenated_elementwise kernel (lower/concat_reads.py);
- SwiGLU over a packed gate/up projection, `(silu(h[:, :f]) * h[:, f:]) @ W_down` with
  h = x W_gate_up, 4096 tokens of width 1024 into 2816: two gemms and one strided_elementwise
  reading the halves where the first gemm wrote them (lower/view_reads.py);
- a GPT-2-small transformer block (examples/transformer_block.py) on 4 sequences of 1024 tokens:
  its attention reads q, k and v where the q|k|v projection wrote them and writes the heads merged
  (a strided_attention, lower/attention_views.py), 7 kernels in all.

Ours is the `@op.kernel` call on torch CUDA tensors, as a user makes it (the examples' kernels);
torch runs the same expression eagerly (SDPA for the block's attention). The floor is each input read once and the output
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

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOLERANCE = 1e-2            # bf16 results: ‖out − ref‖ / ‖ref‖
B, H, S, D = 4, 32, 2048, 128
TOKENS, WIDTH, HIDDEN = 4096, 1024, 2816
BLOCK_BATCH, BLOCK_SEQ, BLOCK_WIDTH, BLOCK_HEAD = 4, 1024, 768, 64


@dataclass(frozen=True)
class ProgramRow:
    name: str
    example: str                                  # the example file's stem
    kernel: str                                   # its kernel
    make: Callable[[], tuple]                     # torch CUDA inputs
    torch_fn: Callable[..., object]
    reference: Callable[..., object]              # float64
    flops: float
    bytes: float


def _example(stem: str):
    spec = importlib.util.spec_from_file_location(f"bench_{stem}", EXAMPLES / f"{stem}.py")
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


def _block(x, ln1_w, ln1_b, w_qkv, b_qkv, w_out, b_out, ln2_w, ln2_b, w_up, b_up, w_down, b_down):
    import torch.nn.functional as F
    b, s, width = x.shape
    heads = width // BLOCK_HEAD
    h = F.layer_norm(x, (width,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv + b_qkv).view(b, s, 3, heads, BLOCK_HEAD).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + (a.transpose(1, 2).reshape(b, s, width) @ w_out + b_out)
    h = F.gelu(F.layer_norm(x, (width,), ln2_w, ln2_b) @ w_up + b_up)
    return x + (h @ w_down + b_down)


def _block_inputs() -> tuple:
    """The block's parameters at a trained model's scale, in the example's order."""
    import torch
    shapes = _example("transformer_block").parameter_shapes(BLOCK_BATCH, BLOCK_SEQ, BLOCK_WIDTH)
    made = []
    for name, shape in shapes.items():
        scale = shape[0] ** -0.5 if name.startswith("w_") else 0.1 if name != "x" else 1.0
        value = torch.randn(*shape, device="cuda") * scale + (1.0 if name in ("ln1_w", "ln2_w") else 0.0)
        made.append(value.to(torch.bfloat16))
    return tuple(made)


def _randn(*shape, scale: float = 1.0):
    import torch
    return (torch.randn(*shape, device="cuda") * scale).to(torch.bfloat16)


def slice_rows() -> list[ProgramRow]:
    """The rows, their inputs made only when run.

    >>> [row.kernel for row in slice_rows()]
    ['rotary_embedding', 'swiglu_mlp', 'transformer_block']
    """
    rope_bytes = (2 * B * H * S * D + 2 * S * D) * 2
    swiglu_flops = 2 * TOKENS * WIDTH * 2 * HIDDEN + 2 * TOKENS * HIDDEN * WIDTH
    swiglu_bytes = (TOKENS * WIDTH * 2 + WIDTH * 2 * HIDDEN + HIDDEN * WIDTH) * 2
    tokens, width = BLOCK_BATCH * BLOCK_SEQ, BLOCK_WIDTH
    block_flops = (2 * tokens * width * 12 * width                                  # the four projections
                   + 2 * BLOCK_BATCH * BLOCK_SEQ * BLOCK_SEQ * width)              # causal Q Kᵀ and P V
    block_bytes = (2 * tokens * width + 12 * width * width) * 2
    return [
        ProgramRow(f"rotary embedding bf16 B={B} H={H} S={S} D={D} (one kernel) vs torch eager", "rotary_swiglu",
                   "rotary_embedding", lambda: (_randn(B, H, S, D), _randn(S, D), _randn(S, D)), _rotate,
                   lambda x, c, s: _rotate(x.double(), c.double(), s.double()), 0, rope_bytes),
        ProgramRow(f"SwiGLU bf16 {TOKENS}x{WIDTH}, hidden {HIDDEN} (halves read in place) vs torch eager",
                   "rotary_swiglu", "swiglu_mlp",
                   lambda: (_randn(TOKENS, WIDTH), _randn(WIDTH, 2 * HIDDEN, scale=WIDTH ** -0.5),
                            _randn(HIDDEN, WIDTH, scale=HIDDEN ** -0.5)),
                   _swiglu, lambda x, a, b: _swiglu(x.double(), a.double(), b.double()), swiglu_flops,
                   swiglu_bytes),
        ProgramRow(f"transformer block bf16 B={BLOCK_BATCH} S={BLOCK_SEQ} width {BLOCK_WIDTH} (attention reads "
                   "q|k|v in place) vs torch eager", "transformer_block", "transformer_block", _block_inputs,
                   _block, lambda *xs: _block(*(x.double() for x in xs)), block_flops, block_bytes),
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
        kernel = getattr(_example(row.example), row.kernel)
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
