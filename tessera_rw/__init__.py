"""tessera_rw: tensor programs in plain Python, rewritten by an e-graph into fused GPU kernels.

>>> from tessera_rw import op
"""

from tessera_rw import eager, graph, numerics, op, profiler
from tessera_rw.tuning import autotune
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import (
    ArgumentError, AttributeValueError, AxisError, DTypeError, HostFallbackWarning, ResultError, RetraceWarning,
    ShapeError, TesseraError, VerifyError)
from tessera_rw.algebra.graph import Graph
from tessera_rw.support.version import package_version

__version__ = package_version()

__all__ = ["op", "numerics", "autotune", "profiler", "graph", "DType", "Graph", "TesseraError", "ShapeError",
           "AxisError", "DTypeError", "AttributeValueError", "ArgumentError", "ResultError", "VerifyError",
           "HostFallbackWarning", "RetraceWarning", "__version__"]
