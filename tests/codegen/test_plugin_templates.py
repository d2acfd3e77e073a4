"""Kernel templates from plugins: the example package's kernel runs its fused op, and broken or
hostile template plugins are skipped with a warning naming them."""

import dataclasses
from importlib import metadata

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.codegen import emulator
from tessera_rw.codegen.templates.plugin_templates import TEMPLATE_ENTRY_POINT_GROUP, load_templates
from tessera_rw.codegen.templates.registry import builtin_templates, templates
from tessera_rw.rules.plugins import PluginError, PluginWarning

FIXTURES = "tests.rules.plugin_fixtures"
RNG = np.random.default_rng(4)


def fake(*targets: str):
    return lambda: [metadata.EntryPoint(name=t.split(":")[1], value=t, group=TEMPLATE_ENTRY_POINT_GROUP)
                    for t in targets]


def reference(x, g, w, eps=1e-6):
    x, g, w = (a.astype(np.float64) for a in (x, g, w))
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g @ w


@op.kernel
def norm_then_project(x, g, w):
    return op.rmsnorm(x, g) @ w


def test_the_example_plugins_kernel_is_chosen_where_it_is_cheaper_and_runs(monkeypatch):
    assert "RmsnormMatmulTemplate" in [type(t).__name__ for t in templates()]
    x, g, w = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 64, 256), (256,), (256, 96)))
    chosen = norm_then_project.explain(x, g, w)
    kernels = chosen.candidates[chosen.chosen].kernels
    assert [(k.kind, k.fused) for k in kernels] == [("gemm", ("rmsnorm",))]
    np.testing.assert_allclose(norm_then_project(x, g, w), reference(x, g, w), rtol=2e-5, atol=2e-5)
    if emulator.available():                 # the plugin's CUDA, run in the emulator
        monkeypatch.setenv("TESSERA_DEVICE", "emulator")
        np.testing.assert_allclose(norm_then_project(x, g, w), reference(x, g, w), rtol=2e-5, atol=2e-5)


def test_the_example_plugins_kernel_that_loses_is_still_weighed_as_a_candidate():
    """bf16 at 4096²: rmsnorm then a tensor-core GEMM wins, and the plugin's SIMT kernel is listed,
    costed, as the fully fused runner-up rather than left out."""
    x, w, g = op.tensor((4096, 4096), "bf16"), op.tensor((4096, 4096), "bf16"), op.tensor((4096,), "bf16")
    report = norm_then_project.explain(x, g, w)
    kinds = [[(k.kind, k.fused) for k in c.kernels] for c in report.candidates]
    assert kinds[report.chosen] == [("layernorm", ()), ("gemm", ())]
    assert [("gemm", ("rmsnorm",))] in kinds
    runner_up = next(c for c in report.candidates if c.kernels[0].fused == ("rmsnorm",))
    assert runner_up.est_us > report.candidates[report.chosen].est_us


def test_broken_and_hostile_template_plugins_are_skipped_with_their_names():
    builtin = builtin_templates()
    with pytest.warns(PluginWarning, match="broken on purpose"):
        assert load_templates(builtin, fake(f"{FIXTURES}:broken_templates")) == ()
    with pytest.warns(PluginWarning, match="42 is not a tessera_rw Template"):
        assert load_templates(builtin, fake(f"{FIXTURES}:not_a_template")) == ()
    with pytest.warns(PluginWarning, match=r"implements \['matmul'\], which GemmTemplate already does"):
        assert load_templates(builtin, fake(f"{FIXTURES}:matmul_template")) == ()
    with pytest.warns(PluginWarning, match="a frozenset of the op names"):
        assert load_templates(builtin, fake(f"{FIXTURES}:string_ops_template")) == ()
    with pytest.raises(PluginError, match="broken on purpose"):
        load_templates(builtin, fake(f"{FIXTURES}:broken_templates"), strict=True)


def test_a_template_implements_only_the_ops_its_own_package_declares():
    builtin = builtin_templates()
    with pytest.warns(PluginWarning, match=r"implements \['rmsnorm_matmul'\], but 'tessera-rw-rmsnorm-matmul' "
                                           r"declares 'rmsnorm_matmul'\n.*its own rule pack declares"):
        assert load_templates(builtin, fake(f"{FIXTURES}:someone_elses_op_template")) == ()
    with pytest.warns(PluginWarning, match=r"implements \['orphan_fused'\], but no rule pack of "
                                           r"'tests.rules.plugin_fixtures' that loaded declares 'orphan_fused'\n"
                                           r".*declare it in the pack's `ops`"):
        assert load_templates(builtin, fake(f"{FIXTURES}:undeclared_op_template")) == ()
    with pytest.warns(PluginWarning, match=r"implements \['reshape'\], but 'reshape' is one of tessera_rw's own ops"):
        assert load_templates(builtin, fake(f"{FIXTURES}:builtin_op_template")) == ()


def test_plugin_templates_are_off_with_the_plugins(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_PLUGINS", "1")
    assert templates() == builtin_templates()


def test_the_plugin_kernels_row_tiles_run_along_the_unbounded_grid_axis():
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate
    t, f32 = RmsnormMatmulTemplate(), DType.float32
    op_ = KernelOp.of("rmsnorm_matmul", (TensorType((4_500_000, 32), f32), TensorType((32,), f32),
                                         TensorType((32, 16), f32)), TensorType((4_500_000, 16), f32), eps=1e-6)
    for s in t.schedules(op_, arch_named("H100-SXM")):
        grid = t.emit(op_, s, arch_named("H100-SXM")).grid
        assert grid[0] * s.bm >= 4_500_000 and grid[1] <= 65535


class _Faulty:
    """The example plugin's template, broken in one method."""

    def __new__(cls, method: str):
        from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

        def broken(self, *args):
            raise RuntimeError(f"{method} is broken on purpose")
        return type("Faulty", (RmsnormMatmulTemplate,), {method: broken})()


@pytest.mark.parametrize("method", ["accepts", "schedules", "resources"])
def test_a_template_that_raises_is_passed_over_and_named(method, monkeypatch):
    from tessera_rw.codegen.templates import registry
    from tessera_rw.codegen.templates.plugin_templates import guarded
    from tessera_rw.tune.cost import kernel_cost
    faulty = guarded(_Faulty(method), "faulty-dist")
    monkeypatch.setattr(registry, "plugin_templates", lambda builtin: (faulty,))
    kernel_cost.cache_clear()
    x, g, w = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 64, 256), (256,), (256, 96)))
    try:
        with pytest.warns(PluginWarning, match=f"Faulty from 'faulty-dist' raised in (schedules or )?{method}"):
            report = op.kernel(lambda x, g, w: op.rmsnorm(x, g) @ w).explain(x, g, w)
    finally:
        kernel_cost.cache_clear()
    assert "rmsnorm_matmul" not in [k.kind for k in report.candidates[report.chosen].kernels]
    str(report)                                           # the report prints


def test_a_template_claiming_to_move_fewer_bytes_than_its_result_is_passed_over():
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.plugin_templates import guarded
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Cheap(RmsnormMatmulTemplate):
        def resources(self, op, schedule, arch):
            return dataclasses.replace(super().resources(op, schedule, arch), hbm_bytes=64)
    f32 = DType.float32
    op_ = KernelOp.of("rmsnorm_matmul", (TensorType((512, 256), f32), TensorType((256,), f32),
                                         TensorType((256, 96), f32)), TensorType((512, 96), f32), eps=1e-6)
    cheap = guarded(Cheap(), "cheap-dist")
    with pytest.warns(PluginWarning, match=r"Cheap from 'cheap-dist' raised in schedules or resources: PluginError: "
                                           r".* moves 64 bytes, fewer than the 196,608 of the result it writes"):
        assert cheap.schedules(op_, arch_named("H100-SXM")) == ()


def test_a_template_whose_emit_fails_is_named_as_the_plugins_fault():
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.codegen.templates.plugin_templates import guarded
    faulty = guarded(_Faulty("emit"), "faulty-dist")
    sample = faulty.samples()[0]
    arch = arch_named("H100-SXM")
    with pytest.raises(PluginError, match=r"Faulty from 'faulty-dist' failed to emit(.|\n)*plugin package 'faulty-dist'"):
        faulty.emit(sample, faulty.schedules(sample, arch)[0], arch)
    assert isinstance(sample, KernelOp)


def test_a_plugin_kernel_that_does_not_compile_names_the_plugin():
    from dataclasses import replace
    from tessera_rw.codegen.compile import CompileError, compile_cuda
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.templates.plugin_templates import guarded
    from tessera_rw_rmsnorm_matmul.template import RmsnormMatmulTemplate

    class Typo(RmsnormMatmulTemplate):
        def emit(self, op, schedule, arch):
            source = super().emit(op, schedule, arch)
            return replace(source, source=source.source + "\nstatic int broken = undefined_name;\n")
    typo = guarded(Typo(), "typo-dist")
    sample, arch = typo.samples()[0], arch_named("H100-SXM")
    kernel = typo.emit(sample, typo.schedules(sample, arch)[0], arch)
    with pytest.raises(CompileError, match=r"undefined_name(.|\n)*plugin package 'typo-dist'"):
        compile_cuda(kernel, "sm_90")
