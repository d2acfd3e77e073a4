"""What a plugin builds on: rules, rulesets, patterns, op declarations and the RulePack; and for a
kernel of its own, the template interface and the CUDA helpers the built-in templates use.

    from tessera_rw.plugin import OpDef, OpKind, Rule, RulePack, Ruleset, TensorType, TermBuilder
    from tessera_rw.plugin import KernelOp, KernelSource, Resources, Schedule, Template

A plugin package exposes a RulePack through the `tessera_rw.rules` entry-point group, and kernel
templates for its ops through `tessera_rw.templates`; see `plugins/rmsnorm_matmul` for a complete
one, and `plugins/README.md`.
"""

from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError, TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.codegen.arch import ArchSpec, MathUnit, arch_named
from tessera_rw.codegen.compile import KernelSource
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.templates.base import Resources, Schedule, Template, grid_space
from tessera_rw.codegen.templates.cuda_scalar import STORAGE, kernel_name
from tessera_rw.codegen.templates.cuda_scalar import load as cuda_load
from tessera_rw.codegen.templates.cuda_scalar import store as cuda_store
from tessera_rw.codegen.templates.plugin_templates import TEMPLATE_ENTRY_POINT_GROUP
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.plugins import ENTRY_POINT_GROUP, PluginError, PluginWarning, RulePack
from tessera_rw.rules.rule import Rule, Ruleset


def cuda_storage(dtype: DType) -> str:
    """The C type a tensor of `dtype` is stored as in a kernel's arguments ('float', 'bf16_t', ...)."""
    return STORAGE[dtype]


__all__ = ["ArchSpec", "AttributeValueError", "DType", "DTypeError", "ENTRY_POINT_GROUP", "Expr", "KernelOp",
           "KernelSource", "MathUnit", "Numerics", "OpDef", "OpKind", "PluginError", "PluginWarning",
           "Resources", "Rule", "RulePack", "Ruleset", "Schedule", "ShapeError",
           "TEMPLATE_ENTRY_POINT_GROUP", "Template", "TensorType", "TermBuilder", "TesseraError",
           "arch_named", "cuda_load", "cuda_storage", "cuda_store", "grid_space", "kernel_name", "promote"]
