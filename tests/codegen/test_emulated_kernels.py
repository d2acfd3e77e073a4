"""Every template's generated kernels, run by the CPU emulator (tessera_rw/codegen/emulator.py),
against the op's float64 numpy reference: each op of emulated_ops.EMULATED (the kinds of problem the
templates' samples pose, at emulator sizes, and the ragged shapes) at default schedules for sm_90
(each op at its first, the ops of a template at every one between them: schedule_cover.py), and
the GEMM, attention and convolution ops at schedules of the tuning space beyond the defaults.
Inputs are random and never zero, the output starts as NaN bytes, and the tolerance is the output
dtype's (kernel_check), as on the GPU (tests/gpu/test_kernel_numerics.py).
"""

from __future__ import annotations

import pytest

from tessera_rw.codegen import emulator
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.templates.registry import templates_for
from tests.codegen.emulated_ops import EMULATED
from tests.codegen.schedule_check import check_schedules
from tests.codegen.schedule_cover import covering
from tests.codegen.test_schedule_spaces import beyond_defaults

pytestmark = [pytest.mark.skipif(not emulator.available(), reason="the CPU emulator needs a C++17 compiler"),
              pytest.mark.usefixtures("module_kernels_built")]

ARCH = arch_named("h100")
BEYOND_DEFAULTS = 2          # tuning-space schedules per op of the kinds a tuner searches
TUNED_KINDS = ("gemm", "flash_attention", "conv")


def run_emulated(op, arrays, schedule, arch):
    return emulator.run_emulated(op, arrays, schedule=schedule, arch=arch)


def check_emulated(template, op, schedules) -> None:
    emulator.build_all([template.emit(op, s, ARCH) for s in schedules])    # the compiles, side by side
    check_schedules(template, op, schedules, ARCH, run_emulated)


def _template(op):
    found = templates_for(op)
    assert found, f"no template accepts {op}"
    return found[0]


def _picked_defaults() -> dict[str, list]:
    """The default schedules each op runs at (schedule_cover.py), the ops of one template covering
    its schedules between them."""
    by_template: dict[type, dict[str, list]] = {}
    for name, op in EMULATED.items():
        template = _template(op)
        by_template.setdefault(type(template), {})[name] = template.schedules(op, ARCH)
    return {name: picked for offered in by_template.values() for name, picked in covering(offered).items()}


PICKED_DEFAULTS = _picked_defaults()


@pytest.mark.parametrize("name", list(EMULATED))
def test_kernel_matches_reference_at_default_schedules(name):
    op = EMULATED[name]
    template = _template(op)
    schedules = PICKED_DEFAULTS[name]
    assert schedules, f"{type(template).__name__} has no default schedule for {op} on {ARCH.name}"
    check_emulated(template, op, schedules)


TUNED = [name for name, op in EMULATED.items() if _template(op).kind in TUNED_KINDS]


@pytest.mark.parametrize("name", TUNED)
def test_kernel_matches_reference_beyond_the_default_schedules(name):
    op = EMULATED[name]
    template = _template(op)
    picked = beyond_defaults(template, op, ARCH, BEYOND_DEFAULTS)
    if not picked:
        pytest.skip(f"the tuning space of {op} holds only its defaults")
    check_emulated(template, op, picked)


ATOMIC = [name for name, op in EMULATED.items() if op.op == "flash_attention_bwd" and op.numerics.value == "fast"]


@pytest.mark.parametrize("order", ["reverse", "shuffle:7"])
@pytest.mark.parametrize("name", ATOMIC[:2])
def test_the_atomic_backward_is_right_whichever_block_arrives_last(name, order):
    """The key blocks of the atomic backward meet through the workspace: whichever block completes a
    query tile converts it. Ascending order always makes the highest-numbered visitor the last; here
    the blocks run backwards (block 0, which visits every tile, completes them all) and shuffled."""
    op = EMULATED[name]
    template = _template(op)
    atomic = [s for s in template.schedules(op, ARCH) if s.dq == "atomic"]
    assert atomic
    check_schedules(template, op, atomic[:1], ARCH,
                    lambda o, arrays, s, arch: emulator.run_emulated(o, arrays, schedule=s, arch=arch, block_order=order))


def kernels_checked(item) -> list:
    """The kernels a selected test of this module runs (built beforehand: tests/conftest.py)."""
    name = item.callspec.params.get("name") if hasattr(item, "callspec") else None
    if name is None:
        return []
    op = EMULATED[name]
    template = _template(op)
    if item.originalname == "test_kernel_matches_reference_at_default_schedules":
        schedules = PICKED_DEFAULTS[name]
    elif item.originalname == "test_kernel_matches_reference_beyond_the_default_schedules":
        schedules = beyond_defaults(template, op, ARCH, BEYOND_DEFAULTS)
    else:
        return []
    return [template.emit(op, s, ARCH) for s in schedules]
