"""`python -m bench cost`: the cost model's decisions, swept over the sizes where they flip.

Attention: fused vs unfused estimated time by sequence length. Convolution: direct vs FFT by kernel
size. Estimates only (the on-device comparison is `python -m bench gpu` on a GPU machine); the
arch is TESSERA_ARCH or H100-SXM.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.table import Table

from tessera_rw import op
from tessera_rw.codegen.arch import target_arch
from tessera_rw.rules.registry import rulesets
from tessera_rw.rules.saturate import rewrite
from tessera_rw.tune.extract import Candidate, FusionDepth, extract_candidates


def candidates(fn, forbid=frozenset(), **inputs) -> tuple[tuple[Candidate, ...], float]:
    start = time.perf_counter()
    found = extract_candidates(rewrite(op.kernel(fn).trace(**inputs), rulesets()), ARCH, forbid=forbid)
    return found, time.perf_counter() - start


def attention(q, k, v):
    return op.softmax((q @ k.mT) * (q.shape[-1] ** -0.5), axis=-1) @ v


def best_at(found: tuple[Candidate, ...], depth: FusionDepth) -> Candidate | None:
    return min((c for c in found if c.fusion_depth is depth), key=lambda c: c.est_us, default=None)


def attention_table() -> Table:
    table = Table(title=f"attention bf16 B=4 H=16 D=64 on {ARCH.name}: estimated µs per candidate")
    for column in ("S", "unfused", "epilogue-fused", "fully fused", "chosen", "unfused HBM MB", "fused HBM MB", "s"):
        table.add_column(column, justify="right")
    for seq in (16, 128, 512, 1024, 4096, 8192):
        found, seconds = candidates(attention, **{n: op.tensor((4, 16, seq, 64), "bf16") for n in "qkv"})
        by_depth = {d: best_at(found, d) for d in FusionDepth}
        cell = lambda c: f"{c.est_us:,.1f}" if c else "-"  # noqa: E731
        mb = lambda c: f"{c.hbm_bytes / 1e6:,.1f}" if c else "-"  # noqa: E731
        table.add_row(str(seq), *(cell(by_depth[d]) for d in FusionDepth), found[0].fusion_depth.label,
                      mb(by_depth[FusionDepth.UNFUSED]), mb(by_depth[FusionDepth.FULL]), f"{seconds:.2f}")
    return table


def conv_table() -> Table:
    table = Table(title=f"conv1d B=16 C=64 causal on {ARCH.name}: direct vs FFT (estimated µs)")
    for column in ("dtype", "L", "kernel", "direct", "fft path", "chosen"):
        table.add_column(column, justify="right")
    for dtype in ("float32", "bfloat16"):
        for length in (2048, 8192):
            for kernel in (3, 7, 15, 31, 64, 128, 256):
                x, w = op.tensor((16, 64, length), dtype), op.tensor((64, 64, kernel), dtype)
                conv = lambda x, w: op.conv1d(x, w, padding=(kernel - 1, 0))  # noqa: E731
                best, _ = candidates(conv, x=x, w=w)
                direct, _ = candidates(conv, forbid={"rfft"}, x=x, w=w)
                spectral, _ = candidates(conv, forbid={"conv1d"}, x=x, w=w)
                chosen = "fft" if any(k.kind == "fft" for k in best[0].kernels) else "direct"
                table.add_row(dtype, str(length), str(kernel), f"{direct[0].est_us:,.1f}",
                              f"{spectral[0].est_us:,.1f}", chosen)
    return table


ARCH = target_arch()


def run(console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    console.print(attention_table())
    console.print(conv_table())
