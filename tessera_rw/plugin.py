"""What a rule plugin builds on: rules, rulesets, patterns, op declarations and the RulePack.

    from tessera_rw.plugin import OpDef, OpKind, Rule, RulePack, Ruleset, TensorType, TermBuilder

A plugin package exposes a RulePack through the `tessera_rw.rules` entry-point group; see
`plugins/rmsnorm_matmul` for a complete one.
"""

from tessera_rw.algebra.dtypes import DType, promote
from tessera_rw.algebra.errors import AttributeValueError, DTypeError, ShapeError, TesseraError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.rules.pattern import Expr, TermBuilder
from tessera_rw.rules.plugins import ENTRY_POINT_GROUP, PluginError, PluginWarning, RulePack
from tessera_rw.rules.rule import Rule, Ruleset

__all__ = ["AttributeValueError", "DType", "DTypeError", "ENTRY_POINT_GROUP", "Expr", "OpDef", "OpKind",
           "PluginError", "PluginWarning", "Rule", "RulePack", "Ruleset", "ShapeError", "TensorType",
           "TermBuilder", "TesseraError", "promote"]
