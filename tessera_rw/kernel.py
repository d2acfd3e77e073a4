"""The kernel object `@op.kernel` returns: traced and compiled once per (shapes, dtypes) signature,
then run — on the GPU when there is one, else by the numpy executor of the same plan.

>>> import numpy as np
>>> from tessera_rw import op
>>> @op.kernel
... def scaled(x, s=2.0):
...     return x * s
>>> scaled(np.ones(3, np.float32))
array([2., 2., 2.], dtype=float32)
>>> scaled(op.tensor((8, 4), "bf16"))
tensor((8, 4), bfloat16)
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Hashable

import numpy as np

from tessera_rw.algebra.api.dispatch import type_of
from tessera_rw.algebra.builder import user_module, user_site, warn_at_user_line
from tessera_rw.algebra.captures import function_name, note_nested
from tessera_rw.algebra.errors import ArgumentError, RetraceWarning, TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.pytree import flatten, is_container
from tessera_rw.algebra.tensor import TensorSpec
from tessera_rw.algebra.trace import Traced, trace
from tessera_rw.bound_call import BoundCall, Signature, holds_symbolic, is_static, static_key
from tessera_rw.codegen.numerics import current_numerics
from tessera_rw import tuning_switch
from tessera_rw.execute import run_program
from tessera_rw.method_kernels import BoundKernel, InstanceKernels
from tessera_rw.warm_calls import WarmCalls

if TYPE_CHECKING:
    from tessera_rw.codegen.arch import ArchSpec
    from tessera_rw.explain_report import ExplainReport
    from tessera_rw.pipeline import CompiledProgram
    from tessera_rw.schedule_control import ScheduleControl
    from tessera_rw.tune.plan_tuner import TuneSettings
    from tessera_rw.tune.space import SpaceRestriction

RETRACE_WARNING_AFTER = 8  # distinct values of one float argument before a call says each retraces


class Kernel:
    """A traced tensor function. Call it on arrays to run it, on op.tensor placeholders to get
    the result's shape and dtype; `graphs` holds one Graph per signature seen so far."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._signature = inspect.signature(fn)
        self._params = self._signature.parameters
        variadic = [p.name for p in self._params.values()
                    if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if variadic:
            stars = "*" if self._params[variadic[0]].kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise ArgumentError(f"@op.kernel function {function_name(fn)} takes {stars}{variadic[0]}; kernels need "
                                "named parameters so each input can be named in graphs and reports")
        self._positional = tuple(self._params)
        self._positional_only_call = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                         for p in self._params.values())
        self._by_keyword = frozenset(n for n, p in self._params.items() if p.kind is p.POSITIONAL_OR_KEYWORD)
        self._traces: dict[Signature, Traced] = {}
        self._retraced: dict[tuple[str, str], set] = {}      # (why, name) -> the float values, shapes, changes seen
        self._programs: dict[tuple, CompiledProgram] = {}
        self._warm_calls = WarmCalls(self._positional if self._positional_only_call else ())
        self.tuning: TuneSettings | None = None          # this kernel's own tuning (@op.autotune, .schedule.autotune)
        self.restriction: SpaceRestriction | None = None  # .schedule.search_space(...)
        self._instances = InstanceKernels()               # per instance, when defined in a class body
        self.made_in = user_module()                      # the module whose code made it (the CLI's targets)
        functools.update_wrapper(self, fn, updated=())   # the name and docs, never fn's attributes

    def __get__(self, obj: Any, owner: type | None = None) -> Kernel | BoundKernel:
        """A kernel defined in a class body, looked up on an instance: that instance's own kernel of
        the method, bound to it (method_kernels.py), so each instance traces once per signature and
        reads its own attributes."""
        if obj is None:
            return self
        return self._instances.bound(self, obj)

    def for_method(self, method: Callable) -> Kernel:
        """The kernel of this one's function bound to an instance, tuned as this one is."""
        bound = self._of(method)
        bound.tuning, bound.restriction = self.tuning, self.restriction
        return bound

    def _of(self, fn: Callable) -> Kernel:
        """A kernel of this kind for `fn`."""
        return Kernel(fn)

    @property
    def name(self) -> str:
        return function_name(self.fn)

    def _called_on_instance(self) -> str:
        """How to call this kernel of a method on an instance (for the hint when `self` is missing)."""
        return f"instance.{function_name(self.fn)}(...)"

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self._positional

    @property
    def graphs(self) -> dict[Signature, Graph]:
        return {sig: t.graph for sig, t in self._traces.items()}

    def _arguments(self, args: tuple, kwargs: dict) -> Any:
        """(name, value) pairs in parameter order. Every parameter given positionally, the usual
        call, skips inspect's general binding (a few microseconds of every warm call)."""
        if not kwargs and len(args) == len(self._positional) and self._positional_only_call:
            return zip(self._positional, args)
        params = self._signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        listing = f"its parameters are {', '.join(params)}" if params else "it takes no parameters"
        if unknown := [k for k in kwargs if k not in params and not takes_any]:
            raise ArgumentError(f"kernel {self.name}: unexpected keyword argument {', '.join(map(repr, unknown))}; "
                                f"{listing}", site=user_site())
        try:
            return self._signature.bind(*args, **kwargs).arguments.items()
        except TypeError as e:
            raise ArgumentError(f"kernel {self.name}: {e}; {listing}", site=user_site()) from None

    def bind(self, *args: Any, **kwargs: Any) -> BoundCall:
        call = BoundCall({}, {}, {}, False, {})
        placeholders = False
        for name, value in self._arguments(args, kwargs):
            if is_container(value) and not is_static(value):
                try:
                    leaves, call.trees[name] = flatten(value, name, stop=is_static)
                except ValueError as e:
                    raise ArgumentError(f"kernel {self.name}: argument {name!r}: {e}", site=user_site()) from None
            else:
                leaves = [(name, value)]
            for leaf_name, leaf in leaves:
                placeholders |= self._sort_into(call, leaf_name, leaf)
        return replace(call, placeholders=placeholders) if placeholders else call

    def _sort_into(self, call: BoundCall, name: str, value: Any) -> bool:
        """Put argument (or container leaf) `name` among `call`'s statics or tensors; whether it is
        a placeholder."""
        if is_static(value):
            call.statics[name] = value.item() if isinstance(value, np.generic) else value
            return False
        try:
            t = type_of(value)
        except TesseraError as e:
            hint = (f"a kernel defined in a class body binds self when looked up on an instance: call "
                    f"{self._called_on_instance()}") if name == "self" else e.hint
            raise ArgumentError(f"kernel {self.name}: argument {name!r} is not a tensor ({e.detail})",
                                hint=hint, site=user_site()) from None
        call.tensors[name] = t
        if isinstance(value, TensorSpec):
            return True
        call.values[name] = value
        return False

    def traced(self, call: BoundCall, *, keep: bool = True) -> Traced:
        """The trace of this call's signature: traced on first use, and again when a name the
        function read outside its arguments (a global, a closure's, `self`'s) holds another array
        or number now. `keep=False` traces a signature not yet traced without making it one of the
        kernel's (what looking a config up does)."""
        found = self._traces.get(call.signature)
        if found is None and not keep:
            return self._trace(call)
        if found is not None and not found.holds():
            self._note_changes(found.changed())
            self._forget_signature(call.signature)
            found = None
        if found is None:
            found = self._traces[call.signature] = self._trace(call)
            self._note_float_values(call.statics)
            self._note_shapes(call.tensors)
        return found

    def _trace(self, call: BoundCall) -> Traced:
        return trace(self.fn, call.tensors, call.statics, name=self.name, trees=call.trees)

    def _forget_signature(self, signature: Signature) -> None:
        """Drop a signature's trace and what was compiled from it."""
        self._traces.pop(signature, None)        # another thread may have dropped it first
        self._programs = {k: p for k, p in self._programs.items() if k[0] != signature}
        self._warm_calls.clear()

    def _note_retrace(self, why: str, name: str, item: Hashable, advice: Callable[[int], str]) -> None:
        """Count `item` among what `name` has been traced with, for reason `why`; at the
        RETRACE_WARNING_AFTER-th distinct one, warn (once) with `advice(count)`."""
        seen = self._retraced.setdefault((why, name), set())
        seen.add(item)
        if len(seen) == RETRACE_WARNING_AFTER:
            warn_at_user_line(RetraceWarning(f"kernel {self.name}: {advice(len(seen))}"))

    def _note_changes(self, names: list[str]) -> None:
        for name in names:                       # each change is an event of its own
            self._note_retrace("changed", name, object(), lambda n: (
                f"{name!r}, which it reads from outside its arguments, has changed {n} times, and each change "
                f"traced and compiled it anew; pass {name} as an argument instead (an array, or a 0-d array for a "
                "number) to make it an input of one program"))

    def _note_shapes(self, tensors: dict[str, TensorType]) -> None:
        for name, t in tensors.items():
            self._note_retrace("shape", name, t.shape, lambda n: (
                f"argument {name!r} has come in {n} shapes, and each traced, rewrote and compiled a program of "
                "its own (shapes are static, as in a CUDA graph); pad varying lengths up to a few bucket sizes "
                "to reuse programs"))

    def _note_float_values(self, statics: dict[str, Any]) -> None:
        for name, value in statics.items():
            if isinstance(value, float):
                self._note_retrace("float", name, static_key(value), lambda n: (
                    f"argument {name!r} has taken {n} float values, and each is a constant of its own trace, "
                    f"traced and compiled anew; pass it as a 0-d array of the dtype of the tensors it meets "
                    f"(np.asarray({name}, np.float32) beside float32 ones) to make it an input of one program"))

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The Graph for these arguments' signature (traced on first use): `k.trace(x, y)`."""
        return self.traced(self.bind(*args, **kwargs)).graph

    @property
    def schedule(self) -> ScheduleControl:
        """`k.schedule.search_space(tile_sizes=[(64, 64)], ...)` and `k.schedule.autotune(max_trials=50)`."""
        from tessera_rw.schedule_control import ScheduleControl
        return ScheduleControl(self)

    def tune_settings(self, default: TuneSettings | None = None) -> TuneSettings | None:
        """How calls of this kernel tune: its own settings, else autotune.enable's, else `default`
        (None: the cost model's choice and default schedules). A search_space narrows any of them."""
        settings = self.tuning or tuning_switch.settings() or default
        if settings is not None and self.restriction is not None:
            settings = replace(settings, restriction=self.restriction)
        return settings

    def forget_programs(self) -> None:
        """Drop the compiled programs, so the next call compiles (and tunes) again."""
        self._programs.clear()
        self._warm_calls.clear()

    def compiled(self, call: BoundCall) -> CompiledProgram:
        """The rewritten, chosen and lowered program for this call's signature (made on first use)."""
        self.traced(call)
        return self.program_of(call.signature)

    def _program_key(self, signature: Signature) -> tuple:
        # the policy steers extraction (tf32 costs less); tuning settings steer the choice
        return signature, current_numerics(), tuning_switch.tuning_cache()

    def program_of(self, signature: Signature) -> CompiledProgram:
        """The program of a signature already traced (made on first use, tuned when tuning is on)."""
        key = self._program_key(signature)
        found = self._programs.get(key)
        if found is None:
            from tessera_rw.pipeline import compile_program
            traced = self._traces[signature]
            found = self._programs[key] = compile_program(traced.graph, None, self.tune_settings(), traced.pins)
        return found

    def program_for_arch(self, signature: Signature, arch: ArchSpec) -> CompiledProgram:
        """The program of a signature already traced, compiled (and tuned, when tuning is on) for
        `arch`; not kept for calls, which run on this machine's GPU."""
        from tessera_rw.pipeline import compile_program
        traced = self._traces[signature]
        return compile_program(traced.graph, arch, self.tune_settings(), traced.pins)

    def program(self, *args: Any, **kwargs: Any) -> CompiledProgram:
        """`k.program(x, y)`: what a call with these arguments runs (candidates, choice, KernelPlan)."""
        return self.compiled(self.bind(*args, **kwargs))

    def explain(self, *args: Any, **kwargs: Any) -> ExplainReport:
        """`k.explain(q, k, v)`: the fusion trace of what a call with these arguments would run, as an
        ExplainReport (`print` it for text, `.to_json()` for the schema). Arrays or op.tensor
        placeholders; nothing is executed: where a call would tune on the GPU and has not yet, the
        report shows the cached choice or else the cost model's (the tuned program once a call has
        made it)."""
        from tessera_rw.explain_report import explain_report
        call = self.bind(*args, **kwargs)
        self.traced(call)
        return explain_report(self._explained_program(call.signature))

    def _explained_program(self, signature: Signature) -> CompiledProgram:
        """The program a call compiled, else one compiled without measuring: from the cache where it
        holds the choice, else the cost model's, writing nothing (and not kept for calls)."""
        from tessera_rw.codegen.arch import target_arch
        from tessera_rw.tune.kernel_tuner import Method
        settings = self.tune_settings()
        if settings is None or self._program_key(signature) in self._programs or \
                Method.resolve(settings.method, self.name, target_arch()) is not Method.ON_DEVICE:
            return self.program_of(signature)
        from tessera_rw.pipeline import compile_program
        traced = self._traces[signature]
        return compile_program(traced.graph, None, replace(settings, method="cost_model", read_only=True), traced.pins)

    def _in_order(self, args: tuple, kwargs: dict) -> tuple | None:
        """Every argument in parameter order, when each parameter is given once (by position or by
        keyword where it may be); else None."""
        if not kwargs:
            return args
        rest = self._positional[len(args):]
        if len(kwargs) != len(rest) or not all(p in kwargs and p in self._by_keyword for p in rest):
            return None
        return args + tuple(kwargs[p] for p in rest)

    def _inline(self, args: tuple, kwargs: dict) -> Any:
        """The call inside another traced function: its ops join that trace, guarded there."""
        note_nested(self.fn)
        return self.fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ordered = self._in_order(args, kwargs)
        key = None if ordered is None else self._warm_calls.key(ordered, tuning_switch.tuning_cache())
        warm = self._warm_calls.get(key)
        if warm is not None:            # a warm call on arrays: no binding, no signature to build
            return warm(ordered)
        if holds_symbolic(args, kwargs):     # called from another traced function
            return self._inline(args, kwargs)
        call = self.bind(*args, **kwargs)
        traced = self.traced(call)
        if call.placeholders:
            outputs = tuple(TensorSpec(o.shape, o.dtype) for o in traced.graph.outputs)
        else:
            program = self.compiled(call)
            outputs = run_program(program, traced.feeds(call.values))
            if key is not None and not call.statics:     # a call that ran: the next one may go warm
                self._warm_calls.remember(key, program, traced)
        return outputs[0] if traced.structure is None else traced.structure(outputs)

    def __repr__(self) -> str:
        return f"<tessera_rw kernel {self.name}: {len(self._traces)} traced signature(s)>"


_KERNEL_USE = ("decorate a function: @op.kernel, or wrap one: op.kernel(f); tuning goes to "
               "@op.autotune(cache=..., method=...), a pinned tile to op.matmul(..., tile_shape=...)")


def kernel(fn: Callable | None = None, **options: Any) -> Kernel | BoundKernel | Callable[[Callable], Kernel | BoundKernel]:
    """Decorator: `@op.kernel def f(q, k, v): ...` traces f per (shapes, dtypes) signature (`@op.kernel()`
    is the same). A kernel already (`op.kernel(op.grad(f))`) is returned as it is.

    >>> import numpy as np
    >>> from tessera_rw import op
    >>> @op.kernel
    ... def scaled_softmax(x):
    ...     return op.softmax(x * 0.5, axis=-1)
    >>> scaled_softmax(np.zeros((2, 4), np.float32))[0]
    array([0.25, 0.25, 0.25, 0.25], dtype=float32)
    """
    if options:
        raise ArgumentError(f"op.kernel takes no options (given {', '.join(options)}): the schedule and the "
                            "fusion are chosen per call signature", hint=_KERNEL_USE)
    if fn is None:
        return kernel
    if not callable(fn):
        raise ArgumentError(f"op.kernel takes the function to trace, not a {type(fn).__name__} ({fn!r:.60})",
                            hint=_KERNEL_USE)
    return fn if isinstance(fn, (Kernel, BoundKernel)) else Kernel(fn)


def autotune(fn: Callable | Kernel | None = None, *, cache: str = "default", method: str = "auto",
             max_trials: int = 50, time_budget_s: float | None = None):
    """Decorator: `@op.autotune(cache="h100_configs")` makes a kernel tune each new signature on its
    first call, keeping the results in the named cache (one file per GPU arch); a later process
    finds them there and tunes nothing. Stacks on `@op.kernel` or stands alone.

    >>> from tessera_rw import op
    >>> @op.autotune(cache="doc_example", method="cost_model")
    ... @op.kernel
    ... def project(x, w):
    ...     return op.gelu(x @ w)
    >>> project.tuning.cache, project.tuning.method.value
    ('doc_example', 'cost_model')
    """
    from tessera_rw.tune.cache import TuneCache
    from tessera_rw.tune.plan_tuner import TuneSettings
    TuneCache(cache)                               # a bad name or method fails here, not at the first call
    settings = TuneSettings(method=method, cache=cache, max_trials=max_trials, time_budget_s=time_budget_s)

    def wrap(f: Callable | Kernel) -> Kernel:
        k = f if isinstance(f, Kernel) else Kernel(f)
        k.tuning = settings
        k.forget_programs()
        return k
    return wrap if fn is None else wrap(fn)
