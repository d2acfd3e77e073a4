"""The built-in rulesets."""

from tessera_rw.rules.library.algebra import ALGEBRA
from tessera_rw.rules.library.attention import ATTENTION
from tessera_rw.rules.library.epilogue import EPILOGUE
from tessera_rw.rules.library.gradient import GRADIENT
from tessera_rw.rules.library.spectral import SPECTRAL

BUILTIN_RULESETS = (ALGEBRA, ATTENTION, SPECTRAL, EPILOGUE, GRADIENT)

__all__ = ["ALGEBRA", "ATTENTION", "EPILOGUE", "GRADIENT", "SPECTRAL", "BUILTIN_RULESETS"]
