"""The built-in rulesets."""

from tessera_rw.rules.library.algebra import ALGEBRA
from tessera_rw.rules.library.attention import ATTENTION
from tessera_rw.rules.library.spectral import SPECTRAL

BUILTIN_RULESETS = (ALGEBRA, ATTENTION, SPECTRAL)

__all__ = ["ALGEBRA", "ATTENTION", "SPECTRAL", "BUILTIN_RULESETS"]
