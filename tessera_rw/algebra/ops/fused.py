"""Fused ops that rewrites produce: a GEMM with its epilogue.

gemm(a, b, [bias], [aux], [residual]) = act(scale · (a @ b) + bias) + residual, cast to `dtype`:
cuBLASLt's epilogue, one kernel instead of a matmul and a train of elementwise passes. A backward
pass's activation derivative is an epilogue too (cuBLASLt's DGELU/DRELU): with activation
"d<act>", act is replaced by y · act'(aux), aux being the pre-activation saved or recomputed from
the forward pass. `trans_a` / `trans_b` say an operand is stored transposed: the product reads
a [..., K, M] array as its [..., M, K] A (cuBLAS's op(A) = Aᵀ), so a transpose feeding a GEMM costs
no copy.
"""

from __future__ import annotations

import functools

import numpy as np

from tessera_rw.algebra.autodiff.cotangents import before_fusion
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import AttributeValueError, ShapeError
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.opdef import OpDef, OpKind
from tessera_rw.algebra.ops.elementwise import ACTIVATION_COTANGENTS, gelu_reference, sigmoid_reference, activation_derivative
from tessera_rw.algebra.ops.linalg import matmul_flops, infer_matmul, read_as
from tessera_rw.algebra.shapes import broadcast_shapes, fmt_shape

ACTIVATIONS = {
    "none": lambda y: y,
    "relu": lambda y: np.maximum(y, 0).astype(y.dtype),
    "gelu": lambda y: gelu_reference(y, "none"),
    "gelu_tanh": lambda y: gelu_reference(y, "tanh"),
    "silu": lambda y: y * sigmoid_reference(y),
}
# "d<act>": y · act'(aux), the backward of y = act(aux)
DERIVATIVES = {f"d{name}": name for name in ACTIVATION_COTANGENTS}
_ACTIVATION_FLOPS = {"none": 0, "silu": 4, "gelu": 8, "gelu_tanh": 8}          # per element; others 1


def takes_aux(activation: str) -> bool:
    """Whether a gemm's activation reads an aux operand (the derivatives do)."""
    return activation in DERIVATIVES


def epilogue_operands(has_bias: bool, activation: str, has_residual: bool) -> tuple[str, ...]:
    """The names of a gemm's operands after a and b, in order."""
    return tuple(name for name, on in (("bias", has_bias), ("aux", takes_aux(activation)),
                                       ("residual", has_residual)) if on)


def _infer_gemm(a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                has_bias: bool, has_residual: bool, accum_dtype: DType | None, dtype: DType,
                trans_a: bool = False, trans_b: bool = False) -> TensorType:
    a, b = read_as(a, trans_a, "a"), read_as(b, trans_b, "b")
    if activation not in ACTIVATIONS and activation not in DERIVATIVES:
        raise AttributeValueError(f"activation must be one of {sorted(ACTIVATIONS) + sorted(DERIVATIVES)}, "
                                  f"got {activation!r}")
    names = epilogue_operands(has_bias, activation, has_residual)
    if len(extra) != len(names):
        raise ShapeError(f"expects {len(names)} epilogue operand(s) {list(names)}, got {len(extra)}")
    mm = infer_matmul(a, b, accum_dtype)
    for name, t in zip(names, extra):
        try:
            fits = broadcast_shapes(mm.shape, t.shape) == mm.shape
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"the {name} {fmt_shape(t.shape)} does not broadcast to the product {fmt_shape(mm.shape)}",
                             hint=f"give the {name} the product's shape, or 1 where it repeats")
    return TensorType(mm.shape, dtype)


def _gemm(a: np.ndarray, b: np.ndarray, *extra: np.ndarray, scale: float, activation: str, has_bias: bool,
          has_residual: bool, accum_dtype, dtype, trans_a: bool = False, trans_b: bool = False) -> np.ndarray:
    y = np.matmul(np.swapaxes(a, -1, -2) if trans_a else a, np.swapaxes(b, -1, -2) if trans_b else b)
    if scale != 1.0:
        y = y * np.asarray(scale, y.dtype)
    rest = iter(extra)
    if has_bias:
        y = y + next(rest)
    if takes_aux(activation):
        y = y * activation_derivative(DERIVATIVES[activation], next(rest)).astype(y.dtype)
    else:
        y = ACTIVATIONS[activation](y)
    if has_residual:
        y = y + next(rest)
    return y


def _gemm_flops(out: TensorType, a: TensorType, b: TensorType, *extra: TensorType, scale: float, activation: str,
                accum_dtype, trans_a: bool = False, trans_b: bool = False, **attrs) -> int:
    """The product's, and per output element the epilogue's: the scale unless 1, an add per bias or
    residual, the activation (its derivative's times the aux it reads)."""
    act = _ACTIVATION_FLOPS.get(DERIVATIVES.get(activation, activation), 1) + takes_aux(activation)
    product = matmul_flops(out, read_as(a, trans_a), read_as(b, trans_b), accum_dtype)
    return product + ((scale != 1.0) + len(extra) + act) * out.numel


DEFS = (
    OpDef("gemm", ("a", "b", "bias", "aux", "residual"), OpKind.MATMUL, _infer_gemm, _gemm, _gemm_flops,
          variadic=True, doc="act(scale · a @ b + bias) + residual in one kernel; act may be a derivative "
                             "d<act>: (…) · act'(aux)", vjp=before_fusion("gemm")),
)


# ---- a chain of elementwise ops as one node ----------------------------------------------

# Elementwise ops without attributes that a fused expression may use, by arity.
FUSIBLE = {1: ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sin", "cos", "erf",
               "sigmoid", "relu", "silu"),
           2: ("add", "sub", "mul", "div", "pow", "maximum", "minimum")}
_ARITY = {name: n for n, names in FUSIBLE.items() for name in names}
MAX_FUSED_INPUTS = 4


@functools.lru_cache(maxsize=1024)          # a plan evaluates the same expressions on every call
def parse_expr(text: str) -> tuple:
    """'add(exp($0),$1)' -> ('add', ('exp', 0), 1): input positions are ints, ops are tuples."""
    pos = 0

    def parse() -> tuple | int:
        nonlocal pos
        if text.startswith("$", pos):
            end = pos + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            index, pos = int(text[pos + 1:end]), end
            return index
        open_ = text.index("(", pos)
        name, pos = text[pos:open_], open_ + 1
        args = [parse()]
        while text[pos] == ",":
            pos += 1
            args.append(parse())
        if text[pos] != ")":
            raise ValueError(f"expected ')' at {pos}")
        pos += 1
        return (name, *args)

    try:
        tree = parse()
        if pos != len(text):
            raise ValueError(f"trailing text at {pos}")
    except (ValueError, IndexError) as e:
        raise AttributeValueError(f"malformed fused expression {text!r}: {e}") from None
    return tree


def _fold(tree, leaf, apply):
    if isinstance(tree, int):
        return leaf(tree)
    name, *args = tree
    if _ARITY.get(name) != len(args):
        raise AttributeValueError(f"{name!r} with {len(args)} operands cannot be fused (fusible: {sorted(_ARITY)})")
    return apply(name, [_fold(a, leaf, apply) for a in args])


def _infer_fused(*xs: TensorType, expr: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS  # the registry holds this module's own ops

    def leaf(i: int) -> TensorType:
        if not 0 <= i < len(xs):
            raise AttributeValueError(f"the expression reads input ${i} of {len(xs)}")
        return xs[i]
    return _fold(parse_expr(expr), leaf, lambda name, args: OPS[name].infer(*args))


def _fused(*xs: np.ndarray, expr: str) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS
    return _fold(parse_expr(expr), lambda i: xs[i], lambda name, args: OPS[name].reference(*args))


def _fused_flops(out: TensorType, *xs: TensorType, expr: str) -> int:
    from tessera_rw.algebra.ops import OPS
    return _fold(parse_expr(expr), lambda i: 0,
                 lambda name, args: sum(args) + OPS[name].flops(out, out, out))


DEFS = DEFS + (
    OpDef("fused_elementwise", ("xs",), OpKind.ELEMENTWISE, _infer_fused, _fused, _fused_flops, variadic=True,
          doc="a tree of elementwise ops over its inputs in one pass, e.g. expr='mul(relu(add($0,$1)),$2)'",
          vjp=before_fusion("fused_elementwise")),
)


# ---- a reduction of an elementwise expression, the expression computed as it is read -----

REDUCES = ("sum", "mean", "max", "min")


def _reduce_op(reduce: str):
    from tessera_rw.algebra.ops import OPS
    if reduce not in REDUCES:
        raise AttributeValueError(f"reduce must be one of {REDUCES}, got {reduce!r}")
    return OPS[reduce]


def _infer_fused_reduction(*xs: TensorType, expr: str, reduce: str, axes: tuple[int, ...],
                           keepdims: bool) -> TensorType:
    return _reduce_op(reduce).infer(_infer_fused(*xs, expr=expr), axes, keepdims)


def _fused_reduction(*xs: np.ndarray, expr: str, reduce: str, axes, keepdims) -> np.ndarray:
    return _reduce_op(reduce).reference(_fused(*xs, expr=expr), axes, keepdims)


def _fused_reduction_flops(out: TensorType, *xs: TensorType, expr: str, reduce: str, axes, keepdims) -> int:
    values = _infer_fused(*xs, expr=expr)
    return _fused_flops(values, *xs, expr=expr) + values.numel


DEFS = DEFS + (
    OpDef("fused_reduction", ("xs",), OpKind.REDUCTION, _infer_fused_reduction, _fused_reduction,
          _fused_reduction_flops, variadic=True,
          doc="sum / mean / max / min of an elementwise expression, computed as it is read (nothing the "
              "size of the expression written), e.g. expr='mul($0,$1)', reduce='sum', axes=(1,)",
          vjp=before_fusion("fused_reduction")),
)


# ---- a row-wise normalization with its elementwise neighbours ----------------------------
#
# fused_normalization(prologue inputs…, weight?, bias?, epilogue inputs…; expr, norm, post):
# post(norm(expr(prologue inputs), weight, bias), epilogue inputs), where in `post` $0 is the
# normalized row and $1… the epilogue inputs. post="$0" is no epilogue.

NORMALIZATIONS = ("softmax", "log_softmax", "layernorm", "rmsnorm")
NO_EPILOGUE = "$0"


def lifts_nothing(op: str, attrs) -> bool:
    """Whether a node of `op` with `attrs` (a mapping or (name, value) pairs) is a normalization
    lifted to fused_normalization with nothing fused (prologue and epilogue `$0`): the epilogue
    rules lift a plain norm so ops after it can join it, and where none did, the plain op in the
    same e-class is the same kernel."""
    if op != "fused_normalization":
        return False
    attrs = dict(attrs)
    return attrs.get("expr") == NO_EPILOGUE and attrs.get("post") == NO_EPILOGUE


def expr_leaves(tree) -> set[int]:
    """The operand indices a parsed expression reads."""
    return {tree} if isinstance(tree, int) else set().union(*(expr_leaves(a) for a in tree[1:]))


def _split(xs: tuple, has_weight: bool, has_bias: bool, post: str) -> tuple[tuple, tuple, tuple]:
    """(prologue inputs, weight/bias, epilogue inputs) of a fused_normalization's operands."""
    after = max(expr_leaves(parse_expr(post)))
    params = has_weight + has_bias
    before = len(xs) - params - after
    if before < 1:
        raise ShapeError(f"{len(xs)} operands cannot hold a prologue, {params} parameter(s) and {after} epilogue input(s)")
    return xs[:before], xs[before:before + params], xs[before + params:]


def _norm_attrs(norm: str, axes: tuple[int, ...], eps: float, has_weight: bool, has_bias: bool) -> dict:
    if norm not in NORMALIZATIONS:
        raise AttributeValueError(f"norm must be one of {NORMALIZATIONS}, got {norm!r}")
    if norm in ("softmax", "log_softmax"):
        if len(axes) != 1 or has_weight or has_bias:
            raise AttributeValueError(f"{norm} normalizes one axis and takes no weight or bias")
        return {"axis": axes[0]}
    return {"axes": axes, "eps": eps, "has_weight": has_weight, "has_bias": has_bias}


def _infer_fused_norm(*xs: TensorType, expr: str, norm: str, axes: tuple[int, ...], eps: float,
                      has_weight: bool, has_bias: bool, post: str) -> TensorType:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    row = _infer_fused(*before, expr=expr)
    normed = OPS[norm].infer(row, *params, **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return _infer_fused(normed, *after, expr=post)


def _fused_norm(*xs: np.ndarray, expr: str, norm: str, axes, eps, has_weight, has_bias, post) -> np.ndarray:
    from tessera_rw.algebra.ops import OPS
    before, params, after = _split(xs, has_weight, has_bias, post)
    normed = OPS[norm].reference(_fused(*before, expr=expr), *params,
                                 **_norm_attrs(norm, axes, eps, has_weight, has_bias))
    return _fused(normed, *after, expr=post)


def _fused_norm_flops(out: TensorType, *xs: TensorType, expr: str, norm: str, post: str, **attrs) -> int:
    before, _, after = _split(xs, attrs["has_weight"], attrs["has_bias"], post)
    return _fused_flops(out, *before, expr=expr) + 7 * out.numel + _fused_flops(out, out, *after, expr=post)


DEFS = DEFS + (
    OpDef("fused_normalization", ("xs",), OpKind.NORMALIZATION, _infer_fused_norm, _fused_norm, _fused_norm_flops,
          variadic=True, doc="softmax / layernorm / rmsnorm between elementwise ops, one pass per row",
          vjp=before_fusion("fused_normalization")),
)


# ---- a weight-gradient GEMM that also writes the bias gradient ---------------------------
#
# matmul_bias_grad(a, b) = [a; 1ᵀ] @ b, of shape [M+1, N]: rows 0..M-1 are a @ b and row M is
# Σ_k b[k, :]. In a linear layer's backward pass (a = Xᵀ, b = dY) that last row is the bias
# gradient, which the weight-gradient GEMM produces for one more row of A (a virtual row of ones,
# cuBLASLt's BGRADB epilogue) instead of a second pass over dY.

def _infer_matmul_bias_grad(a: TensorType, b: TensorType, accum_dtype: DType | None,
                            trans_a: bool = False, trans_b: bool = False) -> TensorType:
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"takes 2-d operands a [M, K] and b [K, N], got {fmt_shape(a.shape)} "
                         f"and {fmt_shape(b.shape)}",
                         hint="flatten leading batch dims into K first (reshape a to [M, B·K], b to [B·K, N])")
    if a.dtype is not b.dtype or not a.dtype.is_float:
        from tessera_rw.algebra.errors import DTypeError
        raise DTypeError(f"takes two operands of one floating-point dtype, got {a.dtype} and {b.dtype}",
                         hint="cast both operands to one float dtype (e.g. op.cast(x, 'bfloat16'))")
    mm = infer_matmul(read_as(a, trans_a, "a"), read_as(b, trans_b, "b"), accum_dtype)
    return TensorType((mm.shape[0] + 1, mm.shape[1]), mm.dtype)


def _matmul_bias_grad(a: np.ndarray, b: np.ndarray, accum_dtype, trans_a: bool = False,
                      trans_b: bool = False) -> np.ndarray:
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    return np.matmul(np.concatenate([a, np.ones((1, a.shape[1]), a.dtype)]), b)


def _matmul_bias_grad_flops(out: TensorType, a: TensorType, b: TensorType, accum_dtype,
                            trans_a: bool = False, trans_b: bool = False) -> int:
    (m, k), n = read_as(a, trans_a).shape, read_as(b, trans_b).shape[1]
    return 2 * m * n * k + k * n


DEFS = DEFS + (
    OpDef("matmul_bias_grad", ("a", "b"), OpKind.MATMUL, _infer_matmul_bias_grad, _matmul_bias_grad,
          _matmul_bias_grad_flops, doc="[a; 1ᵀ] @ b: a @ b with the column sums of b as one more row",
          vjp=before_fusion("matmul_bias_grad")),
)
