"""The built-in rulesets."""

from tessera_rw.rules.library.algebra import ALGEBRA
from tessera_rw.rules.library.attention import ATTENTION

BUILTIN_RULESETS = (ALGEBRA, ATTENTION)

__all__ = ["ALGEBRA", "ATTENTION", "BUILTIN_RULESETS"]
