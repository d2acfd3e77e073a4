"""max_pool2d, avg_pool2d, their gradients and max_pool2d_picked for the CPU emulator: a ResNet stem's 3×3 window,
stride 2, padding 1; ceil_mode's last window running past the padding (an average counting only
what it reaches, with and without the padding); a dilated window; a divisor given; windows wider
than their stride apart (elements no window covers get no gradient); float64 and 16-bit planes."""

from __future__ import annotations

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.templates.pooling import pool_op

BF16, F16, F32, F64 = DType.bfloat16, DType.float16, DType.float32, DType.float64
STEM = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1))


def _max(x, dtype=F32, dilation=(1, 1), ceil_mode=False, **window):
    return dict(x=TensorType(x, dtype), dilation=dilation, ceil_mode=ceil_mode, **(window or STEM))


def _avg(x, dtype=F32, ceil_mode=False, count_include_pad=True, divisor=0, **window):
    return dict(x=TensorType(x, dtype), ceil_mode=ceil_mode, count_include_pad=count_include_pad, divisor=divisor,
                **(window or STEM))


_PROBLEMS = {
    "stem 3x3/2 pad 1 bf16": ("max", _max((2, 3, 17, 17), BF16)),
    "ceil mode, ragged plane f32": ("max", _max((2, 5, 14, 11), ceil_mode=True)),
    "dilated 2x3 window f64": ("max", _max((1, 4, 13, 15), F64, dilation=(2, 1), kernel=(2, 3), stride=(1, 2),
                                           pad=(1, 1))),
    "gaps between windows f16": ("max", _max((3, 2, 12, 12), F16, kernel=(2, 2), stride=(3, 3), pad=(0, 0))),
    "stem counting the padding f32": ("avg", _avg((2, 3, 17, 17))),
    "ceil mode without the padding bf16": ("avg", _avg((2, 5, 14, 11), BF16, ceil_mode=True,
                                                       count_include_pad=False)),
    "divisor given, 3-d x f64": ("avg", _avg((4, 10, 9), F64, divisor=5, kernel=(2, 3), stride=(2, 1),
                                             pad=(1, 1))),
}

POOL_OPS = {f"{kind}_pool2d{part} {name}": pool_op(f"{kind}_pool2d{part}", **problem)
            for name, (kind, problem) in _PROBLEMS.items()
            for part in ("", "_grad") + (("_picked",) if kind == "max" else ())}
# a dilated window straddling a plane one column wide misses it: it picks nothing (zero)
POOL_OPS["max_pool2d_picked dilated windows missing x f32"] = pool_op(
    "max_pool2d_picked", TensorType((2, 3, 2, 1), F32), kernel=(1, 2), stride=(2, 1), pad=(0, 1), dilation=(1, 2),
    ceil_mode=False)
# a max pool's gradient with a relu's mask and a per-channel scale in its epilogue
POOL_OPS["fused_max_pool2d_grad relu mask, per-channel scale f32"] = pool_op(
    "fused_max_pool2d_grad", TensorType((2, 3, 13, 12), F32), extras=(TensorType((2, 3, 13, 12), F32),
                                                                      TensorType((1, 3, 1, 1), F32)),
    post="mul(where(gt($1,0.0:float32),$0,0.0:float32),$2)", **STEM, dilation=(1, 1), ceil_mode=False)
POOL_OPS["fused_max_pool2d_grad relu mask bf16"] = pool_op(
    "fused_max_pool2d_grad", TensorType((2, 4, 17, 17), BF16), extras=(TensorType((2, 4, 17, 17), BF16),),
    post="where(gt($1,0.0:bfloat16),$0,0.0:bfloat16)", **STEM, dilation=(1, 1), ceil_mode=False)
