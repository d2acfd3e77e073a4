"""tessera_rw: tensor programs in plain Python, rewritten by an e-graph into fused GPU kernels.

>>> from tessera_rw import op
"""

from tessera_rw import graph, numerics, op, profiler
from tessera_rw.tuning import autotune
from tessera_rw.algebra.api.dispatch import set_eager_runner
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import (
    ArgumentError, AttributeValueError, AxisError, DTypeError, HostFallbackWarning, ResultError, RetraceWarning,
    ShapeError, TesseraError, VerifyError)
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.ops import on_unknown_op
from tessera_rw.eager import run_eager
from tessera_rw.rules.registry import rulesets
from tessera_rw.support.version import package_version

# The package's two hooks into its lowest layer, installed here once: op calls on arrays compile and
# run through the pipeline (eager.py), and an op name not declared yet loads the rule plugins, which
# may declare it (op.apply("my_fused_op", ...) before any program was rewritten).
set_eager_runner(run_eager)
on_unknown_op(rulesets)

__version__ = package_version()

__all__ = ["op", "numerics", "autotune", "profiler", "graph", "DType", "Graph", "TesseraError", "ShapeError",
           "AxisError", "DTypeError", "AttributeValueError", "ArgumentError", "ResultError", "VerifyError",
           "HostFallbackWarning", "RetraceWarning", "__version__"]
