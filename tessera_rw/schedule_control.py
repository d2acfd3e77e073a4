"""`kernel.schedule`: narrow a kernel's search space and tune it.

    attention.schedule.search_space(tile_sizes=[(64, 64), (128, 64)], pipeline_stages=[2, 3], vectorize=[1, 2, 4])
    attention.schedule.autotune(cost_model="roofline", max_trials=50)

`search_space` applies to every kernel of the program that has the knob (an elementwise kernel has
no tile, so tile_sizes leaves it alone). `autotune` tunes every signature the kernel has been called
or traced with (or the one its arguments give) and keeps tuning later signatures on first call.

>>> from tessera_rw import op
>>> @op.kernel
... def mm(a, b):
...     return op.matmul(a, b)
>>> _ = mm.schedule.search_space(tile_sizes=[(64, 64)])
>>> cfg = mm.schedule.autotune(op.tensor((512, 512), "bf16"), op.tensor((512, 512), "bf16"),
...                            method="cost_model", cache=None)
>>> cfg.knobs()["tile"][:2]
(64, 64)
"""

from __future__ import annotations

from typing import Any

from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.codegen.arch import ArchSpec, resolve_arch
from tessera_rw.kernel import Kernel
from tessera_rw.tune.plan_tuner import TuneSettings
from tessera_rw.tune.space import SpaceRestriction
from tessera_rw.tuning import KERNELS_OWN, TuneConfig, autotune, tuned_kernels

COST_MODELS = ("roofline",)


class ScheduleControl:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel

    def search_space(self, *, tile_sizes=None, pipeline_stages=None, vectorize=None, warps=None) -> ScheduleControl:
        """Allow only these values of each knob (None: any; `search_space()` frees every knob again).
        Programs compiled so far are dropped."""
        self.kernel.restriction = SpaceRestriction.of(tile_sizes, pipeline_stages, vectorize, warps)
        self.kernel.forget_programs()
        return self

    @property
    def restriction(self) -> SpaceRestriction:
        return self.kernel.restriction or SpaceRestriction()

    def autotune(self, *args: Any, cost_model: str = "roofline", max_trials: int = 50, method: str = "auto",
                 cache: str | None | object = KERNELS_OWN, time_budget_s: float | None = None,
                 arch: ArchSpec | str | None = None, **kwargs: Any) -> TuneConfig | list[TuneConfig]:
        """Tune now: the signature of `args` when given (arrays or op.tensor placeholders), else every
        signature seen so far. One TuneConfig per signature (a single one when there is one), kept in
        `cache` (by default the kernel's own, as @op.autotune(cache=...) named it, else "default";
        None: no cache). `arch` (a name such as 'A100-SXM' or 'sm_80') tunes for another GPU than
        the one calls run on: its programs go to the cache, not to the kernel's calls."""
        if cost_model not in COST_MODELS:
            raise ArgumentError(f"{self.kernel.name}.schedule.autotune: unknown cost model {cost_model!r}",
                                hint=f"use one of {list(COST_MODELS)}")
        k = self.kernel
        if args or kwargs:
            call = k.bind(*args, **kwargs)
            k.traced(call)
            signatures = [call.signature]
        else:
            signatures = list(k.graphs)
        if not signatures:
            raise ArgumentError(f"{k.name}.schedule.autotune: the kernel has not been called or traced yet, so "
                                "there is no shape to tune for",
                                hint=f"pass example arguments: {k.name}.schedule.autotune(op.tensor((..), 'bf16'), ...)")
        before = k.tuning
        cache = autotune.cache_of(k, cache)
        k.tuning = TuneSettings(method=method, cache=cache, max_trials=max_trials, time_budget_s=time_budget_s)
        k.forget_programs()
        try:
            programs = [k.program_of(signature) if arch is None else k.program_for_arch(signature, resolve_arch(arch))
                        for signature in signatures]
            configs = [TuneConfig(k.name, program, tuned_kernels(program)) for program in programs]
        except BaseException:
            k.tuning = before                 # a failed call leaves the kernel as it was
            k.forget_programs()
            raise
        return configs[0] if len(configs) == 1 else configs
