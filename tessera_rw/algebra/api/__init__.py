"""The op functions users call, in numpy's names where numpy has the op and torch's where not."""

from tessera_rw.algebra.api.composite import clip, logsumexp, split, square, stack, std, var
from tessera_rw.algebra.api.compute import conv1d, conv2d, fft, flash_attention, ifft, irfft, matmul, rfft
from tessera_rw.algebra.api.creation import arange, full, ones, tril, triu, zeros
from tessera_rw.algebra.api.dispatch import apply, tracing
from tessera_rw.algebra.api.elementwise import (
    abs, add, cast, complex_mul, cos, divide, equal, erf, exp, gelu, greater, greater_equal, less,
    less_equal, log, logical_and, logical_not, logical_or, maximum, minimum, multiply, negative,
    not_equal, power, reciprocal, relu, rsqrt, sigmoid, silu, sin, sqrt, stop_gradient, subtract, tanh,
    where)
from tessera_rw.algebra.api.gather import take, take_along_axis
from tessera_rw.algebra.api.layers import batch_norm, flatten, linear
from tessera_rw.algebra.api.layout import (
    broadcast_to, concatenate, expand_dims, flip, getitem, reshape, squeeze, swapaxes, transpose)
from tessera_rw.algebra.api.losses import cross_entropy
from tessera_rw.algebra.api.padding import pad
from tessera_rw.algebra.api.pooling import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool1d, avg_pool2d,
                                            max_pool1d, max_pool2d)
from tessera_rw.algebra.api.reduction import layernorm, log_softmax, max, mean, min, rmsnorm, softmax, sum

__all__ = [
    "abs", "adaptive_avg_pool2d", "adaptive_max_pool2d", "add", "apply", "arange", "avg_pool1d", "avg_pool2d",
    "batch_norm", "broadcast_to", "cast", "clip", "complex_mul", "concatenate", "conv1d", "conv2d", "cos",
    "cross_entropy", "divide", "equal", "erf", "exp", "expand_dims", "fft", "flash_attention", "flatten", "flip",
    "full", "gelu", "getitem", "greater", "greater_equal", "ifft", "irfft", "layernorm", "less", "less_equal",
    "linear", "log", "log_softmax", "logical_and", "logical_not", "logical_or", "logsumexp", "matmul", "max",
    "max_pool1d", "max_pool2d", "maximum", "mean", "min", "minimum", "multiply", "negative", "not_equal", "ones",
    "pad", "power", "reciprocal", "relu", "reshape", "rfft", "rmsnorm", "rsqrt", "sigmoid", "silu", "sin", "softmax",
    "split", "sqrt", "square", "squeeze", "stack", "std", "stop_gradient", "subtract", "sum", "swapaxes", "take",
    "take_along_axis", "tanh", "tracing", "transpose", "tril", "triu", "var", "where", "zeros",
]


def _refusing_torch_keywords() -> None:
    """Every op function taking `axis`, `keepdims`, `ddof`, `causal` or `mask` refuses torch's names
    for them (`dim`, `keepdim`, `unbiased`, `is_causal`, `attn_mask`...) by name."""
    from tessera_rw.algebra.torch_keywords import numpy_keywords, takes_torch_names
    for name in __all__:
        fn = globals()[name]
        if callable(fn) and not isinstance(fn, type) and takes_torch_names(fn):
            wrapped = numpy_keywords(fn)
            wrapped.__module__ = __name__        # pickled by reference to this module's name for it
            globals()[name] = wrapped


_refusing_torch_keywords()
