"""The kernels a compiled program generates: their CUDA source, launch, and ptxas facts on request.

`--explain` lists them and `--emit-cuda DIR` writes each one as a .cu file (the prelude included,
so `nvcc -cubin` or NVRTC compiles it alone) and compiles it for the program's arch, so the
registers and spills shown are ptxas's own. A library step (cuFFT) has no source of ours.

>>> from tessera_rw import op
>>> from tessera_rw.pipeline import compile_program
>>> @op.kernel
... def f(x):
...     return op.softmax(x, axis=-1)
>>> [k.kind for k in generated_kernels(compile_program(f.trace(op.tensor((64, 128), "bf16"))))]
['softmax']
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tessera_rw.codegen.compile import CompiledKernel, KernelSource, compile_cuda
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw.codegen.plan_binding import BoundStep, bind_plan
from tessera_rw.pipeline import CompiledProgram
from tessera_rw.tune.progress import describe


@dataclass(frozen=True)
class GeneratedKernel:
    """One step of a plan as the GPU runs it: our generated source, or a library call."""
    index: int                       # the plan step
    kind: str
    fused: tuple[str, ...]
    schedule: str
    source: KernelSource | None      # None for a library step
    library: str | None = None       # e.g. "cuFFT" for a library step
    smem_bytes: int = 0              # shared memory per block, static and dynamic (the resource model's)

    @property
    def name(self) -> str:
        return self.source.name if self.source else f"{self.library} {self.kind}"

    @property
    def file_name(self) -> str:
        return f"{self.index:02d}_{self.source.name}.cu" if self.source else ""


def generated_kernels(program: CompiledProgram) -> tuple[GeneratedKernel, ...]:
    """Every step of the program's plan with its source under the schedule it runs; a library step
    is listed whether or not the library loads on this machine. Raises NoTemplateError (a
    TesseraError naming the steps) when some step has no GPU template."""
    bound = bind_plan(program.plan, program.arch, current_numerics(), dict(program.schedules), runnable=False)
    made: dict[tuple, GeneratedKernel] = {}     # a model's repeated layers emit each kernel once
    found = []
    for i, b in enumerate(bound):
        key = ("library", b.op) if b.is_library else b.kernel_key
        if key not in made:
            made[key] = _generated(b, program)
        found.append(replace(made[key], index=i))
    return tuple(found)


def _generated(bound: BoundStep, program: CompiledProgram) -> GeneratedKernel:
    if bound.is_library:
        return GeneratedKernel(-1, bound.kind, bound.fused, "-", None, library="cuFFT")
    smem = bound.template.resources(bound.op, bound.schedule, program.arch).smem_bytes
    return GeneratedKernel(-1, bound.kind, bound.fused, describe(bound.schedule), bound.source(program.arch),
                           smem_bytes=smem)


def emit_cuda(program: CompiledProgram, directory: str | Path,
              compile: bool = True) -> list[tuple[GeneratedKernel, Path, CompiledKernel | None]]:
    """Write each generated kernel to `directory` as NN_name.cu (made if missing); compile each one
    for the program's arch when `compile` (NVRTC needs no GPU) to report its ptxas facts."""
    kernels = generated_kernels(program)        # raises before any folder is made when a step has no template
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kernel in kernels:
        if kernel.source is None:
            continue
        path = out / kernel.file_name
        path.write_text(kernel.source.full_source)
        facts = compile_cuda(kernel.source, program.arch.sm) if compile else None
        written.append((kernel, path, facts))
    return written
