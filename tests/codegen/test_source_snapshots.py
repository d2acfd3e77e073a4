"""The CUDA each template generates, compared with committed snapshots (tests/codegen/snapshots/).

One kernel per template (its first sample at its first default schedule on H100-SXM), plus the code
paths a first sample does not reach: the GEMM with a bias + GELU epilogue and with a GELU derivative
epilogue, GEMMs reading a transposed operand in place, causal attention, the masked attention backward,
depthwise convolution; and the 16-bit GEMMs on A100-SXM, where they run on mma.sync (on H100 they
run on warpgroup MMAs). A template change
that alters generated code shows up as a diff in review; when the change is meant, accept it with

    TESSERA_UPDATE_SNAPSHOTS=1 python -m pytest -q tests/codegen/test_source_snapshots.py

which rewrites the snapshot files (and removes those no case produces any more).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.ops import OPS
from tessera_rw.codegen.arch import ArchSpec, arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.templates.base import Template
from tests.codegen.shipped import shipped_templates
from tessera_rw.codegen.templates.spectral import LibraryKernelError

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("TESSERA_UPDATE_SNAPSHOTS") == "1"
ARCH = arch_named("H100-SXM")
DIFF_LINES = 40
ACCEPT = f"TESSERA_UPDATE_SNAPSHOTS=1 python -m pytest -q tests/codegen/{Path(__file__).name}"


class Case(NamedTuple):
    template: Template
    op: KernelOp
    label: str | None       # what tells this kernel from another of its kind, dtype and fusions
    arch: ArchSpec = ARCH

    @property
    def file(self) -> str:
        kind = self.template.kind_of(self.op)
        parts = ([self.op.op] if self.op.op != kind else []) + list(self.template.fused(self.op))
        parts += ([self.label] if self.label else []) + [self.op.result.dtype.short]
        return f"{kind}_{'_'.join(parts)}.cu"


def _depthwise(op: KernelOp) -> bool:
    return op.op.startswith("conv") and op.attr_map["groups"] == op.operands[0].shape[1] > 1


# Code paths beyond each template's first sample: (what, which sample, label)
EXTRA: tuple[tuple[str, Callable[[KernelOp], bool], str | None], ...] = (
    ("gemm with a bias + gelu epilogue",
     lambda op: op.op == "gemm" and op.attr_map["has_bias"] and op.attr_map["activation"] == "gelu", None),
    ("gemm with an activation-derivative epilogue",
     lambda op: op.op == "gemm" and op.attr_map["activation"] == "dgelu", None),
    ("weight-gradient gemm reading Xᵀ in place",
     lambda op: op.op == "matmul_bias_grad" and op.attr_map["trans_a"] and op.operands[0].dtype is DType.bfloat16,
     "tn"),
    ("gemm reading Wᵀ in place", lambda op: op.op == "gemm" and op.attr_map["trans_b"]
     and not op.attr_map["trans_a"], "nt"),
    ("fp8 gemm transposing its B on the way in", lambda op: op.op == "gemm"
     and op.operands[0].dtype is DType.float8_e4m3 and not op.attr_map["trans_b"], "fp8_nn"),
    ("causal attention", lambda op: op.op == "flash_attention" and op.attr_map["causal"], None),
    ("masked attention backward", lambda op: op.op == "flash_attention_bwd" and op.attr_map["has_mask"], None),
    ("depthwise convolution", _depthwise, "depthwise"),
)
# ... and on sm_80, where 16-bit GEMMs and attention run on mma.sync (sm_90's first schedules are
# warpgroup MMAs)
EXTRA_SM80: tuple[tuple[str, Callable[[KernelOp], bool], str | None], ...] = (
    ("bf16 matmul", lambda op: op.op == "matmul" and op.operands[0].dtype is DType.bfloat16, "mma_sync"),
    ("gemm with a bias + gelu epilogue",
     lambda op: op.op == "gemm" and op.attr_map["has_bias"] and op.attr_map["activation"] == "gelu", "mma_sync"),
    ("causal attention", lambda op: op.op == "flash_attention" and op.attr_map["causal"], "mma_sync"),
)


def cases() -> list[Case]:
    found = [Case(t, t.samples()[0], None) for t in shipped_templates() if t.samples()]
    for extra, arch in ((EXTRA, ARCH), (EXTRA_SM80, arch_named("A100-SXM"))):
        for what, wanted, label in extra:
            match = next((Case(t, op, label, arch) for t in shipped_templates() for op in t.samples()
                          if wanted(op)), None)
            assert match is not None, f"no template sample is a {what}; the snapshot of that code path needs one"
            found.append(match)
    return found


CASES = cases()


def _diff(old: str, new: str, name: str) -> str:
    """The unified diff, cut after DIFF_LINES changed lines."""
    lines, changed = [], 0
    for line in difflib.unified_diff(old.splitlines(), new.splitlines(), f"snapshots/{name}", "emit()",
                                     lineterm=""):
        if line[:1] in "+-" and not line.startswith(("+++", "---")):
            changed += 1
            if changed > DIFF_LINES:
                lines.append(f"... (diff cut after {DIFF_LINES} changed lines)")
                break
        lines.append(line)
    return "\n".join(lines)


def _source(case: Case) -> str:
    try:
        source = case.template.emit(case.op, case.template.schedules(case.op, case.arch)[0], case.arch).source
    except LibraryKernelError as e:
        pytest.skip(f"{case.op.op} is a library call, no generated source: {e}")
    return source if source.endswith("\n") else source + "\n"


def test_snapshot_files_are_distinct():
    names = [c.file for c in CASES]
    assert len(names) == len(set(names)), f"two cases write one file: {sorted(names)}"


@pytest.mark.parametrize("case", CASES, ids=[c.file.removesuffix(".cu") for c in CASES])
def test_generated_source_matches_snapshot(case):
    source = _source(case)
    path = SNAPSHOTS / case.file
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(source, newline="")
    if not path.exists():
        pytest.fail(f"no snapshot {path.name} of {case.op}; write it with {ACCEPT}", pytrace=False)
    snapshot = path.read_text()
    if snapshot != source:
        pytest.fail(f"the {case.template.kind_of(case.op)} source for {case.op} differs from {path.name}:\n"
                    f"{_diff(snapshot, source, path.name)}\n"
                    f"if the change is meant, accept it with {ACCEPT}", pytrace=False)
    first = snapshot.splitlines()[0]
    assert first.startswith("//") and str(case.op) in first, \
        f"{path.name} must open with a header comment naming its op ({case.op}); it opens with {first!r}"


def test_no_stale_snapshots():
    wanted = {c.file for c in CASES}
    stale = sorted(p.name for p in SNAPSHOTS.glob("*.cu") if p.name not in wanted)
    if UPDATE:
        for name in stale:
            (SNAPSHOTS / name).unlink()
        return
    assert not stale, f"snapshots no case produces: {stale}; remove them with {ACCEPT}"


# ---- templates without samples are library calls ---------------------------------------------------

def _fft_probe(name: str) -> KernelOp:
    real, spectrum = TensorType((16, 64, 2112), DType.float32), TensorType((16, 64, 1057), DType.complex64)
    x = {"rfft": real, "irfft": spectrum}.get(name, TensorType((16, 64, 1024), DType.complex64))
    n = x.shape[-1] if name != "irfft" else 2112
    attrs = dict(n=n, axis=2, norm="backward")
    return KernelOp.of(name, (x,), OPS[name].infer(x, **attrs), **attrs)


LIBRARY_PROBES: dict[str, Callable[[str], KernelOp]] = {name: _fft_probe for name in ("rfft", "irfft", "fft", "ifft")}


@pytest.mark.parametrize("template", [t for t in shipped_templates() if not t.samples()],
                         ids=lambda t: type(t).__name__)
def test_template_without_samples_is_a_library_call(template):
    assert template.library is not None, f"{type(template).__name__} emits source but has no samples to snapshot"
    for name in sorted(template.ops):
        assert name in LIBRARY_PROBES, (f"{type(template).__name__} has no samples, so its {name} source is never "
                                        f"snapshotted: give it samples(), or add a library probe here")
        op = LIBRARY_PROBES[name](name)
        with pytest.raises(LibraryKernelError):
            template.emit(op, template.schedules(op, ARCH)[0], ARCH)
