"""NVRTC compilation through cuda.core, with the facts ptxas reports about each kernel.

Compiling needs no GPU, so every generated kernel's registers, spills and shared memory are known
on any machine. Cubins and their facts are kept on disk across processes (binary_cache):

>>> k = compile_cuda(KernelSource("twice", 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2; }'), "sm_90")
>>> (k.registers > 0, k.spill_bytes)
(True, 0)
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from functools import lru_cache

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.binary_cache import KernelFacts, binary_cache
from tessera_rw.codegen.prelude import HOPPER_HELPERS, HOPPER_TARGET, PRELUDE
from tessera_rw.codegen.tensor_map import TensorMapSpec


class CompileError(TesseraError):
    """NVRTC rejected a generated kernel; the message shows the source lines around the error."""


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel: its entry-point name, CUDA C++ text (without the prelude) and the launch
    it was written for. Its arguments are the operand pointers in operand order, then the output,
    then, when `workspace_bytes` is not 0, a scratch buffer of that many bytes that every launch
    zeroes first, then one TMA tensor map per entry of `tensor_maps` (built at launch from the
    operands' pointers)."""
    name: str
    source: str
    threads: int = 0                          # block size it was written for (0: set at launch)
    grid: tuple[int, int, int] = (1, 1, 1)    # blocks along x, y, z
    dynamic_smem: int = 0                     # bytes of dynamic shared memory per block
    fast_math: bool = False                   # compile with --use_fast_math (the `fast` numerics policy)
    target: str | None = None                 # the arch-specific target its instructions need ('sm_90a': wgmma)
    tensor_maps: tuple[TensorMapSpec, ...] = ()   # TMA maps it takes after the pointers
    workspace_bytes: int = 0                  # zeroed scratch it takes after the output (0: none)
    origin: str = "tessera_rw"                # the package whose template wrote it (a plugin's name)

    @property
    def full_source(self) -> str:
        return PRELUDE + (HOPPER_HELPERS if self.target == HOPPER_TARGET else "") + "\n" + self.source


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    arch: str
    cubin: bytes
    registers: int
    spill_stores: int           # bytes per thread
    spill_loads: int
    stack_bytes: int
    smem_bytes: int             # static shared memory
    log: str

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


_FUNCTION = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def ptxas_facts(log: str, name: str) -> dict[str, int]:
    """Registers, spills, stack and static smem of kernel `name` from a `ptxas -v` log."""
    facts = {"registers": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0, "smem_bytes": 0}
    current = None
    for line in log.splitlines():
        if m := _FUNCTION.search(line):
            current = m.group(1)
        elif "Compiling entry function" in line:
            current = line.split("'")[1]
        if current != name:
            continue
        if m := _STACK.search(line):
            facts.update(stack_bytes=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        if m := _USED.search(line):
            facts["registers"] = int(m[1])
        if m := _SMEM.search(line):
            facts["smem_bytes"] = int(m[1])
    return facts


def _excerpt(source: str, log: str, context: int = 3) -> str:
    """The source lines the first NVRTC error points at, numbered."""
    m = re.search(r"\((\d+)\): error", log)
    if not m:
        return ""
    lines = source.splitlines()
    at = int(m[1]) - 1
    window = range(max(0, at - context), min(len(lines), at + context + 1))
    return "\n".join(f"{'>' if i == at else ' '}{i + 1:5d} | {lines[i]}" for i in window)


@lru_cache(maxsize=512)
def _compile(full_source: str, name: str, arch: str, options: tuple[str, ...]) -> CompiledKernel:
    from cuda.core import Program, ProgramOptions
    log = io.StringIO()
    opts = ProgramOptions(name=f"{name}.cu", arch=arch, ptxas_options=["-v"], std="c++17",
                          use_fast_math="fast_math" in options)
    store = binary_cache()
    key = store.key(full_source, opts) if store else b""
    if store and (hit := store.get(key, name, arch)):
        cubin, facts = hit
        return CompiledKernel(cubin=cubin, **facts.model_dump())
    try:
        cubin = Program(full_source, "c++", opts).compile("cubin", logs=log)
    except Exception as e:
        text = str(e)
        raise CompileError(f"NVRTC could not compile kernel {name} for {arch}:\n{text.strip()}\n"
                           f"{_excerpt(full_source, text)}",
                           hint="this is a code generator bug; please report it with the lines above") from None
    text = log.getvalue().replace("\x00", "")
    compiled = CompiledKernel(name, arch, bytes(cubin.code), log=text, **ptxas_facts(text, name))
    if store:
        store.put(key, compiled.cubin, KernelFacts(**{k: v for k, v in vars(compiled).items() if k != "cubin"}))
    return compiled


def compile_cuda(kernel: KernelSource, arch: str, *, fast_math: bool = False) -> CompiledKernel:
    """Compile one generated kernel to a cubin for `arch` ('sm_80', 'sm_90', ...), with fast math
    when the kernel was generated for it or the caller asks. A kernel using arch-specific
    instructions is built for that target ('sm_90a' for `arch` 'sm_90'), whose cubin loads on that
    arch only; asking for another arch is an error."""
    if kernel.target:
        if arch.removesuffix("a") != kernel.target.removesuffix("a"):
            raise CompileError(f"kernel {kernel.name} uses {kernel.target}-only instructions and cannot be built "
                               f"for {arch}", hint=f"emit the op for {arch}'s arch: its template picks a schedule "
                                                   f"that runs there")
        arch = kernel.target
    try:
        return _compile(kernel.full_source, kernel.name, arch, ("fast_math",) if kernel.fast_math or fast_math else ())
    except CompileError as e:
        if kernel.origin == "tessera_rw":
            raise
        raise CompileError(e.detail, hint=f"the kernel comes from a template of the plugin package {kernel.origin!r}: "
                                          "report it to its authors with the lines above") from None
