"""What a user reaching for an op tessera_rw does not have is told: how to write it with ours, or
where it has to run instead.

>>> print(unknown_op("cumsum", ["sum", "mean"]))
tessera_rw.op has no op 'cumsum': there is no scan op; a short one is a sum of shifted slices (op.pad and x[..., :n]), else run it on the host after the kernel
>>> print(unknown_op("softmx", ["softmax", "log_softmax"]))
tessera_rw.op has no op 'softmx'; did you mean 'softmax', 'log_softmax'?
"""

from __future__ import annotations

import difflib
from typing import Iterable

_MATMUL = "use op.matmul (the @ operator); a batched product is a @ b over the leading dims"
_INDEX = "there are no index-valued ops (they are not differentiable); take it on the host from the kernel's result"

MISSING_OPS = {
    "sort": "there is no sort op; sort on the host after the kernel", "argsort": _INDEX,
    "argmax": _INDEX, "argmin": _INDEX, "topk": _INDEX,
    "cumsum": "there is no scan op; a short one is a sum of shifted slices (op.pad and x[..., :n]), else run it on "
              "the host after the kernel",
    "cumprod": "there is no scan op; run it on the host after the kernel",
    **dict.fromkeys(("round", "floor", "ceil", "trunc"), "there is no rounding op; op.cast(x, 'int32') truncates "
                    "toward zero, else round on the host after the kernel"),
    "prod": "there is no product reduction; for positive x, op.exp(op.sum(op.log(x), axis))",
    "einsum": "write it with op.matmul, op.transpose and op.reshape; " + _MATMUL,
    "dot": _MATMUL, "mm": _MATMUL, "bmm": _MATMUL, "tensordot": _MATMUL, "outer": "use x[:, None] * y[None, :]",
    "inner": "use op.sum(x * y, axis=-1)", "cat": "use op.concatenate(xs, axis)", "clamp": "use op.clip(x, lo, hi)",
    "chunk": "use op.split(x, n, axis)", "unsqueeze": "use op.expand_dims(x, axis)",
    "permute": "use op.transpose(x, axes)",
    "softplus": "use op.log(1 + op.exp(x))", "log1p": "use op.log(1 + x)", "expm1": "use op.exp(x) - 1",
    "leaky_relu": "use op.where(x > 0, x, slope * x)", "sign": "use op.where(x > 0, 1.0, op.where(x < 0, -1.0, 0.0))",
    "dropout": "dropout needs random numbers, which kernels do not draw; pass a mask in as an input",
    "norm": "use op.sqrt(op.sum(x * x, axis))", "repeat": "use op.concatenate([x] * n, axis)",
    "tile": "use op.broadcast_to on a reshape, or op.concatenate([x] * n, axis)",
}


def unknown_op(name: str, known: Iterable[str]) -> AttributeError:
    """The error for `op.<name>` where there is no such op: the way to write it, else close names."""
    head = f"tessera_rw.op has no op {name!r}"
    if name in MISSING_OPS:
        return AttributeError(f"{head}: {MISSING_OPS[name]}")
    close = difflib.get_close_matches(name, list(known), n=3)
    if close:
        return AttributeError(f"{head}; did you mean {', '.join(map(repr, close))}?")
    return AttributeError(f"{head} (the ops are listed in tessera_rw.op.__all__)")
