"""`from tessera_rw import autotune`: tune ops and kernels, and manage what the tuning cache keeps.

    autotune.enable(True)                    # @op.kernel calls tune each new signature (then cache it)
    cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model")
    print(cfg)                               # Best config: tile=(128, 128, 32), pipeline_depth=3, ...
    autotune.load(op.matmul, (1024, 1024, 1024), dtype="bf16")   # the cached config, or None
    autotune.save_cache("h100.json"); autotune.load_cache("h100.json")

`shapes` is one shape per operand, or for matmul (M, N, K), or one shape every operand shares.
Methods: 'on_device' times on the GPU, 'cost_model' ranks by the roofline model, 'auto' measures
when a GPU is present.

>>> from tessera_rw import op
>>> cfg = autotune(op.matmul, shapes=(1024, 1024, 1024), dtype="bf16", method="cost_model", cache=None)
>>> str(cfg).startswith("Best config: tile=("), str(cfg.chosen_by)
(True, 'cost_model')
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tessera_rw.algebra import api
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.algebra.ops import OPS
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.codegen.arch import ArchSpec, resolve_arch
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw.codegen.templates.registry import refusal, template_for
from tessera_rw.kernel import Kernel
from tessera_rw.method_kernels import BoundKernel
from tessera_rw.pipeline import CompiledProgram, compile_program
from tessera_rw import tuning_switch
from tessera_rw.report import Printable
from tessera_rw.tune.cache import TuneCache, TuneCacheWarning
from tessera_rw.tune.extract import FusionDepth
from tessera_rw.tune.kernel_tuner import KernelTuning, TuneError, cached_schedule
from tessera_rw.tune.plan_tuner import TuneSettings, tunable_ops, why_untunable
from tessera_rw.tune.progress import trials_table
from tessera_rw.tune.records import ChosenBy
from tessera_rw.tune.space import SpaceRestriction, knobs

KERNELS_OWN = object()      # a tuning call's default cache: the kernel's own, else autotune.enable's
KNOB_NAMES = {"tile": "tile", "pipeline_stages": "pipeline_depth", "vectorize": "vectorize", "warps": "warps"}


@dataclass(frozen=True)
class TuneConfig:
    """The tuned program of one signature: its chosen candidate and every kernel's schedule.
    `str()` is the one-line summary of its heaviest kernel; `table()` shows what was weighed."""
    name: str
    program: CompiledProgram
    kernels: tuple[KernelTuning, ...]

    @property
    def chosen_by(self) -> ChosenBy:
        """How the program was chosen: from the cache only when its kernels' schedules came from
        there too (a cached fusion depth whose kernels were tuned anew says how they were);
        INTERPOLATED when the cache answered from nearby shapes; PINNED when every kernel's schedule
        was pinned, so nothing was tuned."""
        if self.kernels and all(k.chosen_by is ChosenBy.PINNED for k in self.kernels):
            return ChosenBy.PINNED
        if self.program.chosen_by is not ChosenBy.CACHE:
            return self.program.chosen_by
        ways = {k.chosen_by for k in self.kernels} - {ChosenBy.CACHE, ChosenBy.PINNED}
        for way in (ChosenBy.ON_DEVICE, ChosenBy.COST_MODEL, ChosenBy.INTERPOLATED):
            if way in ways:
                return way
        return ChosenBy.CACHE

    @property
    def main(self) -> KernelTuning | None:
        """The kernel that takes the most time: the one the summary describes."""
        return max(self.kernels, key=lambda k: k.time_us, default=None)

    @property
    def fusion(self) -> bool:
        return self.program.candidate.fusion_depth > FusionDepth.UNFUSED

    def knobs(self) -> dict[str, object]:
        """The main kernel's schedule in the product's words: tile, pipeline_depth, vectorize, warps."""
        main = self.main
        return {KNOB_NAMES[k]: v for k, v in knobs(main.schedule).items()} if main else {}

    @property
    def time_us(self) -> float:
        return sum(k.time_us for k in self.kernels)

    def _summary(self) -> str:
        parts = [f"{k}={v}" for k, v in self.knobs().items()] + [f"fusion={self.fusion}"]
        return "Best config: " + ", ".join(parts)

    def __str__(self) -> str:
        # a shape never tuned takes the nearest tuned one's config: say so
        marker = " (interpolated from the nearest tuned shape)" if self.chosen_by is ChosenBy.INTERPOLATED else ""
        return self._summary() + marker

    def table(self) -> Printable:
        """A table per tuned kernel: schedule, time, % of best (print() gives text, rich's print colour)."""
        tables = [trials_table(f"{k.op.op} [{k.kind}] chosen by {k.chosen_by}", k.trials,
                               next((t for t in k.trials if t.schedule == k.schedule), None))
                  for k in self.kernels if k.trials]
        return Printable(*tables)

    @property
    def signature(self) -> str:
        """What was tuned: 'matmul(bf16[512,512], bf16[512,512])'."""
        return f"{self.name}({', '.join(str(n.type) for n in self.program.graph.inputs)})"

    def __repr__(self) -> str:
        if self.chosen_by is ChosenBy.INTERPOLATED:      # the times are the nearest tuned shapes'
            return (f"<TuneConfig {self.signature}: {self._summary()} (interpolated: {self.time_us:.1f} µs at the "
                    "nearest tuned shape)>")
        return f"<TuneConfig {self.signature}: {self} ({self.chosen_by}, {self.time_us:.1f} µs)>"


def _operand_names(fn: Callable, shapes: Sequence) -> list[str]:
    """The operands of op function `fn` to tune: its required ones, then as many of the optional
    tensor operands its op declares (layernorm's weight and bias, attention's mask) as `shapes`
    lists beyond them."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    declared = OPS[fn.__name__].operands if getattr(fn, "__name__", None) in OPS else ()
    optional = [p.name for p in params if p.default is None and p.name in declared]
    listed = len(shapes) if shapes and not all(isinstance(d, int) for d in shapes) else 0
    return required + optional[:max(0, listed - len(required))]


def _check_tunable(name: str, program: CompiledProgram, arch: ArchSpec) -> None:
    """A TuneError when the program runs kernels but none has a schedule to tune on `arch`."""
    numerics = current_numerics()
    if not program.plan.steps or tunable_ops(program.plan, numerics, arch):
        return
    ops = [KernelOp.from_node(s.node, numerics) for s in program.plan.steps]
    reasons = dict.fromkeys(why_untunable(op, arch) for op in ops)
    refused = any(refusal(op) is not None for op in ops)        # a kernel has its name but not these operands
    raise TuneError(f"autotune({name}): nothing to tune on {arch.name}: {'; '.join(filter(None, reasons))}",
                    hint="tune a form the kernel takes, as the reason says" if refused
                    else "tune a float32, bf16 or fp16 form of it, or name another arch")


def _as_kernel(fn: Callable | Kernel | BoundKernel, shapes: Sequence = ()) -> Kernel:
    if isinstance(fn, BoundKernel):
        return fn.kernel
    if isinstance(fn, Kernel):
        return fn
    if not callable(fn) or isinstance(fn, np.ufunc) or getattr(fn, "__module__", None) == "numpy":
        name = getattr(fn, "__name__", repr(fn))
        raise ArgumentError(f"autotune: {fn!r} is not an op or a kernel",
                            hint=f"pass an op function such as op.{name if hasattr(api, name) else 'matmul'}, "
                                 "or an @op.kernel function")
    names = _operand_names(fn, tuple(shapes) if isinstance(shapes, Sequence) else ())

    def call(*xs):
        return fn(**dict(zip(names, xs)))        # by name: an optional operand may follow attributes
    call.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])
    call.__name__ = getattr(fn, "__name__", "op")
    return Kernel(call)


def _operand_shapes(kernel: Kernel, fn: Callable | Kernel, shapes: Sequence) -> list[tuple[int, ...]]:
    n, name = len(kernel.parameter_names), kernel.name
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence):
        raise ArgumentError(f"autotune {name}: shapes={shapes!r} is not a shape or a sequence of shapes",
                            hint="shapes=(1024, 1024, 1024) for a matmul's (M, N, K), or one tuple per operand")
    shapes = tuple(shapes)
    flat = [d for d in shapes if not isinstance(d, Sequence)]
    if flat and (odd := next((d for d in flat if not isinstance(d, numbers.Integral) or isinstance(d, bool)), None)):
        raise ArgumentError(f"autotune {name}: the dimension {odd!r} in shapes={shapes!r} is not an integer",
                            hint="dimensions are ints: shapes=(1024, 1024, 1024)")
    if negative := [d for s in shapes for d in (s if isinstance(s, Sequence) else (s,))
                    if isinstance(d, numbers.Integral) and d < 0]:
        raise ArgumentError(f"autotune {name}: shapes={shapes!r} has the negative dimension {negative[0]}",
                            hint="dimensions are sizes: 0 or more")
    if shapes and len(flat) == len(shapes):
        shapes = tuple(int(d) for d in shapes)
        if fn is api.matmul and len(shapes) == 3:
            m, nn, k = shapes
            return [(m, k), (k, nn)]
        return [shapes] * n       # one shape every operand shares (a matmul's square matrices)
    if len(shapes) != n:
        raise ArgumentError(f"autotune {name}: {len(shapes)} shapes for {n} operands "
                            f"({', '.join(kernel.parameter_names)})", hint="give one shape per operand")
    return [tuple(int(d) for d in s) for s in shapes]


def _placeholders(kernel: Kernel, fn: Callable | Kernel, shapes, dtype) -> list[TensorSpec]:
    shaped = _operand_shapes(kernel, fn, shapes)
    dtypes = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(shaped)
    if len(dtypes) != len(shaped):
        raise ArgumentError(f"autotune {kernel.name}: {len(dtypes)} dtypes for {len(shaped)} operands")
    return [TensorSpec(s, d) for s, d in zip(shaped, dtypes)]


def _cache_to_read(name: str, cache: str | None, named: bool) -> TuneCache:
    """The cache `autotune.load` reads: a name given outright (but the default) must be a cache that
    exists, as a misspelt one would otherwise answer None as if it had nothing for the kernel."""
    if cache is None:
        raise ArgumentError(f"autotune.load({name}, cache=None): a load reads a cache",
                            hint="name a cache, or leave cache out for the kernel's own (else autotune.enable's)")
    store = TuneCache(cache)
    if named and cache != tuning_switch.DEFAULT_CACHE and not store.folder.is_dir():
        raise ArgumentError(f"autotune.load({name}): there is no autotune cache named {cache!r} in {store.root}",
                            hint=f"caches there: {', '.join(store.names_beside()) or 'none'}")
    return store


def _restriction(name: str, search_space: SpaceRestriction | Mapping[str, Any] | None) -> SpaceRestriction:
    """`search_space=` as a SpaceRestriction: one already, a mapping of `kernel.schedule.search_space`'s
    keywords, or None (every schedule)."""
    if search_space is None or isinstance(search_space, SpaceRestriction):
        return search_space or SpaceRestriction()
    keywords = tuple(inspect.signature(SpaceRestriction.of).parameters)
    if isinstance(search_space, Mapping) and not (odd := set(search_space) - set(keywords)):
        return SpaceRestriction.of(**search_space)
    got = f"the keys {sorted(odd)}" if isinstance(search_space, Mapping) else repr(search_space)
    raise ArgumentError(f"autotune({name}): search_space takes a dict of {', '.join(keywords)}; got {got}",
                        hint='search_space={"tile_sizes": [(64, 64), (128, 64)], "pipeline_stages": [2, 3]}')


def _file_path(function: str, path: object) -> str | os.PathLike[str]:
    if isinstance(path, (str, os.PathLike)):
        return path
    raise ArgumentError(f"autotune.{function}: the file must be a path (a str or pathlib.Path), got {path!r}",
                        hint=f'autotune.{function}("h100.json")')


def tuned_kernels(program: CompiledProgram) -> tuple[KernelTuning, ...]:
    return program.tuning.tuning.kernels if program.tuning is not None else ()


class Autotune:
    """The `autotune` object: call it to tune; its methods switch tuning on and manage the cache.

    Whether `@op.kernel` calls tune, and into which cache: `enable()` says it for the process (the
    environment's TESSERA_AUTOTUNE=1 before that), `with autotune.scoped(...)` for one block of one
    thread or task, which wins inside it.

    >>> with autotune.scoped(cache="doc_example"):
    ...     autotune.enabled, autotune.cache
    (True, 'doc_example')
    """

    @property
    def enabled(self) -> bool:
        return tuning_switch.enabled()

    @property
    def cache(self) -> str:
        return tuning_switch.cache()

    def enable(self, on: bool = True, *, cache: str | None = None) -> None:
        """Make `@op.kernel` calls tune each new signature (from the cache when it knows it), in
        the whole process."""
        tuning_switch.enable(on, cache_name=cache)

    @contextlib.contextmanager
    def scoped(self, on: bool = True, *, cache: str | None = None) -> Iterator[Autotune]:
        """Tuning on (or off) inside the block only, in this thread or task; the process's setting
        returns after it, even after an error."""
        with tuning_switch.scoped(on, cache=cache):
            yield self

    def settings(self) -> TuneSettings | None:
        """The settings a kernel call tunes with when tuning is on, else None."""
        return tuning_switch.settings()

    def __call__(self, fn: Callable | Kernel, shapes: Sequence, dtype: Any = "float32", method: str = "auto", *,
                 cache: str | None | object = KERNELS_OWN, max_trials: int = 50, time_budget_s: float | None = None,
                 search_space: SpaceRestriction | Mapping[str, Any] | None = None,
                 arch: ArchSpec | str | None = None) -> TuneConfig:
        """Tune `fn` (an op function or an @op.kernel) at `shapes` and `dtype` for `arch` (an ArchSpec,
        a name such as 'A100-SXM' or 'sm_80', or None: this machine's GPU or TESSERA_ARCH); see the module.
        `max_trials` and `time_budget_s` bound the schedules measured on the GPU; the cost model
        weighs every schedule of the search space."""
        kernel = _as_kernel(fn, shapes)
        name = kernel.name
        traced = kernel.traced(kernel.bind(*_placeholders(kernel, fn, shapes, dtype)))
        _check_tunable(name, compile_program(traced.graph, arch, pins=traced.pins), resolve_arch(arch))
        settings = TuneSettings(method=method, cache=self.cache_of(kernel, cache),
                                restriction=_restriction(name, search_space), max_trials=max_trials,
                                time_budget_s=time_budget_s)
        program = compile_program(traced.graph, arch, settings, traced.pins)
        return TuneConfig(name, program, tuned_kernels(program))

    def cache_of(self, kernel: Kernel, cache: str | None | object) -> str | None:
        """The cache a tuning call on `kernel` uses: the one named (None: none), or for KERNELS_OWN
        the kernel's own (@op.autotune(cache=...)), else enable's."""
        if cache is not KERNELS_OWN:
            return cache
        return kernel.tuning.cache if kernel.tuning is not None else self.cache

    def load(self, fn: Callable | Kernel, shapes: Sequence, dtype: Any = "float32", *,
             cache: str | None | object = KERNELS_OWN,
             arch: ArchSpec | str | None = None) -> TuneConfig | None:
        """The cached config for `fn` at `shapes` (the nearest cached shape's, marked interpolated,
        when this one was never tuned), or None when the cache has nothing for it. Never tunes."""
        kernel = _as_kernel(fn, shapes)
        store = _cache_to_read(kernel.name, self.cache_of(kernel, cache), named=cache is not KERNELS_OWN)
        arch = resolve_arch(arch)
        traced = kernel.traced(kernel.bind(*_placeholders(kernel, fn, shapes, dtype)), keep=False)
        program = compile_program(traced.graph, arch, pins=traced.pins)
        defaults = dict(program.schedules)
        pinned = {p.step for p in program.pinned}
        found = []
        for i, op in tunable_ops(program.plan, current_numerics(), arch):
            hit = None if i in pinned else cached_schedule(op, arch, store, restriction=kernel.restriction)
            if hit is None:
                continue
            schedule, record = hit
            chosen_by = ChosenBy.INTERPOLATED if record.interpolated else ChosenBy.CACHE
            kind = template_for(op).kind_of(op)
            found.append((i, KernelTuning(op, kind, schedule, defaults[i], chosen_by, record.time_us, record.noise_us,
                                          None, 0, 0, record)))
        if not found:
            return None
        schedules = defaults | {i: k.schedule for i, k in found}
        loaded = replace(program, chosen_by=ChosenBy.CACHE, schedules=tuple(sorted(schedules.items())))
        return TuneConfig(kernel.name, loaded, tuple(k for _, k in found))

    def save_cache(self, path: str | os.PathLike[str], *, cache: str | None = None) -> int:
        """Write every record of the cache (all archs) to `path`; returns how many. Saving an empty
        cache while other named caches hold records warns, naming them."""
        store = TuneCache(cache or self.cache)
        written = store.export(_file_path("save_cache", path))
        if not written:
            holding = [n for n in store.names_beside() if n != store.name and TuneCache(n, store.root).records()]
            if holding:
                warnings.warn(f"autotune cache {store.name!r} has no records, so {os.fspath(path)} holds none; "
                              f"{', '.join(map(repr, holding))} hold some: save_cache(path, cache={holding[0]!r})",
                              TuneCacheWarning, stacklevel=2)
        return written

    def load_cache(self, path: str | os.PathLike[str], *, cache: str | None = None) -> int:
        """Merge the records of an exported file into the cache; returns how many were new or better."""
        return TuneCache(cache or self.cache).import_(_file_path("load_cache", path))

    def __repr__(self) -> str:
        return f"<autotune: {'on' if self.enabled else 'off'}, cache {self.cache!r}>"


autotune = Autotune()
