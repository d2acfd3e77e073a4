"""`python -m bench gpu` where it cannot run: one line saying why, a nonzero exit, no traceback.

Besides this machine as it is, a stand-in `torch` package on the path plays a torch that sees no GPU,
and one that sees a GPU cuda.core cannot find."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera_rw.codegen.device import gpu_available

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = '''__version__ = "0.0-stand-in"
class version:
    cuda = "12.0"
class cuda:
    @staticmethod
    def is_available():
        return {available}
'''
needs_no_gpu = pytest.mark.skipif(gpu_available(), reason="with a GPU the benchmark would run for minutes")


def bench_gpu(path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "bench", "gpu", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def stand_in_torch(tmp_path: Path, available: bool) -> Path:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STAND_IN.format(available=available))
    return tmp_path


def assert_one_clear_line(done: subprocess.CompletedProcess, says: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench gpu") and says in lines[0], output


@needs_no_gpu
def test_on_this_machine_without_a_gpu():
    assert_one_clear_line(bench_gpu(), "needs")


def test_torch_without_a_gpu(tmp_path):
    assert_one_clear_line(bench_gpu(stand_in_torch(tmp_path, False)), "torch 0.0-stand-in sees none")


@needs_no_gpu
def test_torch_sees_a_gpu_that_cuda_core_does_not(tmp_path):
    assert_one_clear_line(bench_gpu(stand_in_torch(tmp_path, True)), "cuda.core does not")


def test_every_row_it_would_time_has_a_kernel_for_sm_90():
    """Each row's op is taken by a template that emits it at every schedule the run would time, so a
    GPU run fails on nothing this machine can find out first."""
    from bench.gpu import kernels_to_compile
    from bench.gpu_rows import rows
    from tessera_rw.codegen.arch import arch_named

    arch = arch_named("h100")
    timed = rows(quick=False)
    kernels = list(kernels_to_compile(timed, arch, quick=False))
    assert {op for _, op, _ in kernels} == {row.op for row in timed}      # a row whose template fails is left out
    for template, op, schedule in kernels:
        assert str(op) in template.emit(op, schedule, arch).source
