"""Running generated CUDA kernels on the CPU, so their numerics are checked on machines without a GPU.

The kernel's own source — the text NVRTC compiles, fragment layouts, swizzles, pipelines and all —
is compiled by the host C++ compiler against an emulation of the CUDA execution model
(emulator_runtime.h: a block's threads are coroutines, __syncthreads and warp collectives are
barriers) and of the PTX the prelude spells out (emulator_ptx.h: mma.sync, ldmatrix, cp.async with
its deferred completion, the conversions). Blocks run one after another on one core, so this is
for checking, not for speed.

What it catches: wrong indexing, swizzles and fragment layouts, edges and predicates, a stage read
before its cp.async group is waited for, a missing barrier that lets a warp read what another has
not written yet (warps run ahead of one another between barriers), divergent barriers, mbarrier
phases waited on wrongly (a deadlock), and a stage handed back before the wgmmas reading it retire
(the arriving thread steps aside and the producer refills the stage at once). What it does not:
data races between threads that the run order happens to hide, bank conflicts, anything about speed.

>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.node import TensorType
>>> t = TensorType((3, 5), DType.float32)
>>> x = np.arange(15, dtype=np.float32).reshape(3, 5) + 1
>>> np.allclose(run_emulated(KernelOp.of("exp", (t,), t), [x]), np.exp(x))       # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np

from tessera_rw.algebra.errors import TesseraError
from tessera_rw.codegen.arch import ArchSpec, arch_named
from tessera_rw.codegen.binary_cache import SWITCH_VARIABLE
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.launch import check_launch_shape, check_operands, coerce_scalars
from tessera_rw.codegen.prelude import PORTABLE_HELPERS, TYPES, emulated_wgmma_helpers
from tessera_rw.codegen.templates.base import first_schedule
from tessera_rw.support.cache_dir import cache_root

COMPILER_VARIABLE = "CXX"            # the host C++ compiler; default g++ (then c++, clang++)
# -Og: half -O1's compile time, for kernels that run about a third slower; a test suite's kernels
# are compiled once and run a few times
_FLAGS = ("-std=c++17", "-Og", "-w", "-fno-strict-aliasing")
_HERE = Path(__file__).parent
POISON = 0xFF                         # every output byte before the run: NaN in any float type
BLOCK_ORDER_VARIABLE = "TESSERA_EMULATOR_BLOCK_ORDER"     # read by emulator_runtime.cpp's scheduler


class EmulatorError(TesseraError):
    """The emulator could not compile or run a kernel."""


@cache
def compiler() -> str | None:
    """The host C++ compiler the emulator uses, or None when the machine has none."""
    wanted = os.environ.get(COMPILER_VARIABLE)
    for name in ([wanted] if wanted else ["g++", "c++", "clang++"]):
        if path := shutil.which(name):
            return path
    return None


def available() -> bool:
    """Whether kernels can be emulated here (a C++ compiler with C++17 and ucontext)."""
    return compiler() is not None and os.name == "posix"


_C_LINKAGE = re.compile(r'extern\s+"C"\s*')
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?(?P<type>[\w ]+?)\s+(?P<name>\w+)\[\];")


def emulator_prelude() -> str:
    """What every emulated kernel includes: the runtime, the prelude's typedefs and portable
    helpers, and the emulated PTX helpers."""
    return "\n".join(["#pragma once", (_HERE / "emulator_runtime.h").read_text(), TYPES, PORTABLE_HELPERS,
                      (_HERE / "emulator_ptx.h").read_text(), emulated_wgmma_helpers()])


def emulated_source(sources: Sequence[KernelSource]) -> str:
    """The C++ program that runs any of `sources` on the CPU (after `#include`-ing
    emulator_prelude()): each kernel in a namespace of its own, and a main whose first argument
    picks the kernel and whose others map one file per kernel argument.

    A kernel's text is the one NVRTC compiles, except that its dynamic shared memory (an
    `extern __shared__` array) becomes a pointer into the emulator's arena, and that it loses its C
    linkage: in an unnamed namespace, helpers and kernels of the same name in two of `sources` stay
    apart, and the `__shared__` statics of inline helpers are the TU's own (not COMDAT), so they
    sit in the one section of shared variables beside the kernels' own. Kernels
    compiled together share the compiler's work on the prelude they use: ten GEMM schedules build
    in one program in a third of the CPU time ten programs take."""
    parts, binders = [f'#include "{_PRELUDE_NAME}"'], []
    for i, source in enumerate(sources):
        kernel = _DYNAMIC_SHARED.sub(lambda m: f"{m['type']}* const {m['name']} = ({m['type']}*)emu::dynamic_smem_arena();",
                                     source.source)
        parts.append(f"namespace kernel_{i} {{ namespace {{\n{_C_LINKAGE.sub('', kernel)}\n}} }}  // namespace kernel_{i}")
        binders.append(f"    [](void** args, int nargs) {{ return emu::bind_kernel(kernel_{i}::{source.name}, args, nargs); }},")
    parts += ["int main(int argc, char** argv) {", "  static const emu::Binder kernels[] = {", *binders, "  };",
              f"  return emu::run_main(argc, argv, kernels, {len(sources)});", "}", ""]
    return "\n".join(parts)


_PRELUDE_NAME = "tessera_emulator.h"


def _compile(cxx: str, args: list[str], what: str) -> None:
    done = subprocess.run([cxx, *_FLAGS, *args], capture_output=True, text=True, errors="replace")
    if done.returncode:
        raise EmulatorError(f"the host compiler rejected {what} for the emulator:\n{done.stderr[-4000:]}",
                            hint="the kernel uses a CUDA feature emulator_runtime.h does not provide")


_RUNTIME_OBJECT = "emulator_runtime.o"


def _prelude_dir(cxx: str) -> Path:
    """A directory holding emulator_prelude() as a header, precompiled (g++ reads the .gch beside it
    in place of the text), and the scheduler of emulator_runtime.cpp compiled against it, which
    every kernel's program links; built once per prelude, runtime and compiler."""
    text = emulator_prelude()
    runtime = (_HERE / "emulator_runtime.cpp").read_text()
    digest = hashlib.sha256("\0".join((text, runtime, cxx, *_FLAGS)).encode()).hexdigest()[:16]
    path = _program_dir() / f"prelude-{digest}"
    header = path / _PRELUDE_NAME
    if not header.exists():
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="tessera-emulator-", dir=path) as tmp:
            staged = Path(tmp) / _PRELUDE_NAME
            staged.write_text(text)
            source = Path(tmp) / "emulator_runtime.cpp"
            source.write_text(runtime)
            _compile(cxx, ["-c", "-I", tmp, "-o", f"{tmp}/{_RUNTIME_OBJECT}", str(source)], "the emulator's runtime")
            os.replace(f"{tmp}/{_RUNTIME_OBJECT}", path / _RUNTIME_OBJECT)
            if Path(cxx).name.endswith("g++"):
                _compile(cxx, ["-x", "c++-header", "-o", f"{staged}.gch", str(staged)], "the emulator's prelude")
                os.replace(f"{staged}.gch", f"{header}.gch")
            os.replace(staged, header)       # last: its presence says the directory is complete
    return path


def _program_dir() -> Path:
    if os.environ.get(SWITCH_VARIABLE, "").lower() in ("off", "0", "false"):
        return Path(_scratch())
    path = cache_root() / "emulator"
    path.mkdir(parents=True, exist_ok=True)
    return path


@cache
def _scratch() -> str:
    return tempfile.mkdtemp(prefix="tessera-emulator-")


def _arguments_dir() -> str | None:
    """Where the argument files go: memory-backed /dev/shm when the machine has it."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass(frozen=True)
class EmulatedKernel:
    """A generated kernel built for the CPU emulator: call it with the launch's arrays.

    Each launch runs in a process of its own, so a kernel that faults (an out-of-bounds access, a
    stack overflow) fails that launch with an EmulatorError instead of taking the caller down."""
    source: KernelSource
    program: Path
    index: int                   # which of the program's kernels it is

    def __call__(self, arrays: Sequence[np.ndarray], *, writes: Sequence[int] = (-1,), timeout: float = 600.0,
                 block_order: str = "ascending") -> None:
        """Run the kernel once over `arrays` (operands, then the output), as `source.grid` blocks of
        `source.threads` threads; what it writes to the arrays at positions `writes` (default: the
        output, the last, which is all a generated kernel writes) lands in them. The others are the
        kernel's own copies, as a device's copies of host inputs are. A kernel that takes a
        workspace gets a zeroed one after the output, as a launch does. `block_order` is the order
        the blocks run in: "ascending", "reverse" or "shuffle:<seed>" (a kernel whose blocks meet
        through global memory must be right in any)."""
        if block_order not in ("ascending", "reverse") and not re.fullmatch(r"shuffle:\d+", block_order):
            raise EmulatorError(f"block order {block_order!r} is not 'ascending', 'reverse' or 'shuffle:<seed>'")
        check_launch_shape(self.source)
        writes = [i % len(arrays) for i in writes]
        scratch = [np.zeros(self.source.workspace_bytes, np.uint8)] if self.source.workspace_bytes else []
        with tempfile.TemporaryDirectory(prefix="tessera-emulator-", dir=_arguments_dir()) as tmp:
            files = [os.path.join(tmp, f"arg{i}") for i in range(len(arrays) + len(scratch))]
            for path, a in zip(files, [*arrays, *scratch]):
                np.ascontiguousarray(a).tofile(path)
            command = [str(self.program), str(self.index), *map(str, self.source.grid), str(self.source.threads),
                       str(self.source.dynamic_smem), *files, *(m.emulator_argument() for m in self.source.tensor_maps)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                                      env=os.environ | {BLOCK_ORDER_VARIABLE: block_order})
            except FileNotFoundError:
                raise EmulatorError(f"the emulator's build of kernel {self.source.name} is gone ({self.program})",
                                    hint="build(source) compiles it again") from None
            except subprocess.TimeoutExpired:
                raise EmulatorError(f"kernel {self.source.name} ran past {timeout:.0f} s in the emulator",
                                    hint="emulate a smaller problem, or look for a barrier it never leaves") from None
            if done.returncode:
                why = done.stderr.strip() or (f"killed by signal {-done.returncode} (a fault: an access "
                                              "outside its buffers or its stack)" if done.returncode < 0
                                              else f"exit status {done.returncode}")
                raise EmulatorError(f"kernel {self.source.name} failed in the emulator: {why}",
                                    hint="this is a code generator bug; please report it with the kernel's source")
            for i in writes:
                arrays[i][...] = np.fromfile(files[i], dtype=arrays[i].dtype).reshape(arrays[i].shape)


def build(source: KernelSource) -> EmulatedKernel:
    """Compile `source` for the emulator (kept on disk by the hash of its program's C++ text)."""
    return build_all([source])[0]


# kernels one program holds: a program's fixed cost (the prelude, the link) is most of a small one's
# (16 kernels build in a program in 1.5 s, 8 in programs of their own in 4.8 s)
MAX_BATCH = 16
_KEPT = 1024        # built kernels remembered in this process, oldest forgotten first
_built: dict[KernelSource, EmulatedKernel] = {}


def build_all(sources: Sequence[KernelSource]) -> list[EmulatedKernel]:
    """build() each of `sources`: those neither built in this process nor named by the on-disk
    index (another process's builds) compiled in as few programs as hold them, MAX_BATCH kernels at
    most to a program, one host compiler per core."""
    if not available():
        raise EmulatorError("emulating a kernel needs a C++17 compiler on a POSIX system; none was found",
                            hint=f"install g++ (or set {COMPILER_VARIABLE}), or run the kernel on a GPU")
    found = {s: _built[s] for s in sources if s in _built and _built[s].program.exists()}
    missing = [s for s in dict.fromkeys(sources) if s not in found]
    if missing:
        cxx = compiler()
        prelude, index = _prelude_dir(cxx).name, _index_dir()
        keys = {s: _kernel_key(s, prelude, cxx) for s in missing}
        found |= {s: kernel for s in missing if (kernel := _indexed(s, index / keys[s])) is not None}
        unbuilt = [s for s in missing if s not in found]
        count = -(-len(unbuilt) // MAX_BATCH)
        batches = [unbuilt[i::count] for i in range(count)]
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            for batch, programs in zip(batches, pool.map(_build_batch, batches)):
                found.update((source, EmulatedKernel(source, *at)) for source, at in zip(batch, programs))
                for source, (program, at) in zip(batch, programs):
                    _index(index / keys[source], program, at)
        _built.update((s, found[s]) for s in missing)
        for stale in list(_built)[:max(0, len(_built) - _KEPT)]:
            del _built[stale]
    return [found[s] for s in sources]


def _kernel_key(source: KernelSource, prelude: str, cxx: str) -> str:
    """The on-disk index's name for `source` built against `prelude` (its directory's name, which
    holds its digest) with `cxx`: whichever program holds it, another process finds it there."""
    parts = (source.name, source.source, prelude, cxx, *_FLAGS)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _index_dir() -> Path:
    path = _program_dir() / "kernels"
    path.mkdir(exist_ok=True)
    return path


def _indexed(source: KernelSource, entry: Path) -> EmulatedKernel | None:
    """`source` as some process built it into a program still on disk (its index `entry` says
    which), or None."""
    try:
        name, index = entry.read_text().split()
    except (OSError, ValueError):
        return None
    program = _program_dir() / name
    return EmulatedKernel(source, program, int(index)) if program.exists() else None


def _index(entry: Path, program: Path, index: int) -> None:
    """Record in index `entry` that its kernel is kernel `index` of `program` (written whole, then
    renamed)."""
    fd, tmp = tempfile.mkstemp(dir=entry.parent)
    with os.fdopen(fd, "w") as f:
        f.write(f"{program.name} {index}")
    os.replace(tmp, entry)


def _build_batch(batch: list[KernelSource]) -> list[tuple[Path, int]]:
    """The program and index of each of `batch`'s kernels: one program for all, or, when the
    compiler rejects that, a program per kernel (whose errors name the kernel at fault)."""
    try:
        program = _build_program(batch)
        return [(program, i) for i in range(len(batch))]
    except EmulatorError:
        if len(batch) == 1:
            raise
        return [(_build_program([source]), 0) for source in batch]


def _build_program(batch: list[KernelSource]) -> Path:
    cxx = compiler()
    prelude = _prelude_dir(cxx)
    text = emulated_source(batch)
    digest = hashlib.sha256("\0".join((text, str(prelude), cxx, *_FLAGS)).encode()).hexdigest()[:24]
    names = "+".join(s.name for s in batch)
    target = _program_dir() / f"{names[:80]}-{digest}"
    if not target.exists():
        with tempfile.TemporaryDirectory(prefix="tessera-emulator-", dir=target.parent) as tmp:
            cpp, program = Path(tmp) / "kernel.cpp", Path(tmp) / "kernel"
            cpp.write_text(text)
            what = f"kernel {batch[0].name}" if len(batch) == 1 else f"kernels {', '.join(s.name for s in batch)}"
            _compile(cxx, ["-I", str(prelude), "-o", str(program), str(cpp), str(prelude / _RUNTIME_OBJECT)], what)
            os.replace(program, target)      # atomic: a concurrent build of the same program is the same file
    return target


def run_emulated(op: KernelOp, inputs: Sequence, *, schedule=None, arch: ArchSpec | str = "h100",
                 block_order: str = "ascending") -> np.ndarray:
    """Run one op's generated kernel on the CPU: its template's kernel for `arch` at `schedule`
    (default: the template's first), on numpy inputs, its blocks in `block_order`; the output is
    poisoned with NaN bytes first, so an element the kernel never writes stays NaN."""
    from tessera_rw.codegen.templates.registry import template_for
    inputs = coerce_scalars(op, list(inputs))
    check_operands(op, inputs)
    template = template_for(op)
    if template.library is not None:
        raise EmulatorError(f"{op.op} runs as a {template.library} call: there is no generated kernel to emulate",
                            op=op.op, hint="check it with the numpy executor, or on a GPU")
    spec = arch if isinstance(arch, ArchSpec) else arch_named(arch)
    schedule = schedule or first_schedule(template, op, spec)
    source = template.emit(op, schedule, spec)
    arrays = [np.ascontiguousarray(np.asarray(x, dtype=t.dtype.numpy)) for x, t in zip(inputs, op.operands)]
    out = np.empty(op.result.shape, op.result.dtype.numpy)
    out.reshape(-1).view(np.uint8)[:] = POISON
    build(source)([*arrays, out], block_order=block_order)
    return out
