"""What VJP rules are written with: cotangents are symbolic tensors, and these are the moves that
every family of rules shares (summing over broadcast axes, undoing a reduction, zero-filling,
complex parts).

A cotangent has its value's shape. For a complex value z = a + ib feeding a real loss L it is
∂L/∂a + i ∂L/∂b (torch's convention), so a holomorphic op with derivative f' passes back
`g * conj(f'(z))`, and a real operand of a complex result takes the real part.

Complex scalars are never written as graph constants here (the e-graph encodes constants as
f64): complex tensors are scaled by real constants and zeros are cast from real ones.

>>> from tessera_rw.algebra.api import tracing
>>> from tessera_rw.algebra.builder import make_input
>>> from tessera_rw.algebra.dtypes import DType
>>> from tessera_rw.algebra.tensor import SymbolicTensor
>>> with tracing():
...     g = SymbolicTensor(make_input("g", (4, 3), DType.float64))
...     b = SymbolicTensor(make_input("b", (3,), DType.float32))
...     unbroadcast(g, b).node.type
TensorType(shape=(3,), dtype=<DType.float32: 'float32'>)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tessera_rw.algebra.dtypes import DType, real_of
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.tensor import SymbolicTensor, api   # api resolves when a rule runs

Tensor = SymbolicTensor
Cotangents = tuple[Tensor | None, ...]


def constant(value: float, dtype: DType) -> Tensor:
    """A 0-d constant; for a complex dtype, a real one of the same width (mul promotes it)."""
    dtype = real_of(dtype) if dtype.is_complex else dtype
    value = float(value) if dtype.is_float else int(value) if dtype.is_integer else bool(value)
    return api.apply("constant", (), value=value, dtype=dtype)


def scaled(x: Tensor, factor: float) -> Tensor:
    """x · factor, with no complex constant in the graph."""
    return x * constant(factor, x.dtype) if x.dtype.is_complex else x * factor


def zero(like: Any) -> Tensor:
    """A 0-d zero of `like`'s dtype, to fill where no cotangent flows."""
    if like.dtype.is_complex:
        return api.cast(constant(0.0, like.dtype), like.dtype)
    return constant(0, like.dtype)


def real_part(z: Tensor) -> Tensor:
    """Re z. There is no real-part op, but an irfft of length 1 is exactly Re of its one bin."""
    column = api.reshape(z, z.shape + (1,))
    return api.reshape(api.irfft(column, n=1, axis=-1), z.shape)


def conj(z: Tensor) -> Tensor:
    """The complex conjugate (2 Re z - z); real tensors are their own."""
    if not z.dtype.is_complex:
        return z
    re = api.cast(real_part(z), z.dtype)
    return re + re - z


def to_dtype(ct: Tensor, dtype: DType) -> Tensor:
    """A cotangent in its operand's dtype; a real operand of a complex value takes the real part."""
    if ct.dtype is dtype:
        return ct
    if ct.dtype.is_complex and not dtype.is_complex:
        ct = real_part(ct)
    return api.cast(ct, dtype)


def unbroadcast(ct: Tensor, like: Any) -> Tensor:
    """`ct` summed over the axes numpy broadcasting added or stretched to reach it from `like`'s
    shape, in `like`'s dtype: the cotangent of a broadcast operand."""
    shape = tuple(like.shape)
    lead = ct.ndim - len(shape)
    if lead < 0:
        raise TesseraError(f"a cotangent {ct.node.type} cannot sum down to shape {shape}")
    stretched = tuple(lead + i for i, d in enumerate(shape) if d == 1 and ct.shape[lead + i] != 1)
    axes = tuple(range(lead)) + stretched
    if axes:
        ct = api.reshape(api.sum(ct, axis=axes), shape)
    return to_dtype(ct, like.dtype)


def expand_reduced(g: Tensor, shape: tuple[int, ...], axes: tuple[int, ...]) -> Tensor:
    """A reduction's result (or its cotangent) repeated over the axes it reduced; a constant one
    (the seed of a loss that is a sum) stays a constant of the new shape."""
    if g.node.op == "full":
        return api.full(shape, g.node.attr("value"), g.dtype)
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return api.broadcast_to(api.reshape(g, kept), shape)


def pad_zeros(x: Tensor, pads: Sequence[tuple[int, int]]) -> Tensor:
    """x with zeros added before and after each axis (a real 0 pads complex tensors too)."""
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    if not any(lo or hi for lo, hi in pads):
        return x
    value = 0 if x.dtype.is_integer or x.dtype is DType.bool else 0.0
    return api.apply("pad", (x,), pads=pads, value=value)


def crop(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    """x[..., start:stop, ...] along one axis."""
    index = (slice(None),) * axis + (slice(start, stop),)
    return api.getitem(x, index)


def fit_length(x: Tensor, axis: int, size: int) -> Tensor:
    """x cut or zero-extended at the end of `axis` to `size`: undoes a forward op's pad-or-truncate."""
    have = x.shape[axis]
    if have > size:
        return crop(x, axis, 0, size)
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, size - have)
    return pad_zeros(x, pads)


def dilate(x: Tensor, axis: int, step: int) -> Tensor:
    """x with step - 1 zeros between neighbours along `axis` (length (L - 1)·step + 1): what a
    strided read's cotangent looks like before it is placed."""
    length = x.shape[axis]
    if step == 1 or length == 0:
        return x
    split = api.reshape(x, x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
    pads = [(0, 0)] * split.ndim
    pads[axis + 1] = (0, step - 1)
    spread = api.reshape(pad_zeros(split, pads), x.shape[:axis] + (length * step,) + x.shape[axis + 1:])
    return crop(spread, axis, 0, (length - 1) * step + 1)


def no_cotangents(g: Tensor, out: Tensor, *operands: Tensor, **attrs: Any) -> Cotangents:
    """The VJP of an op whose result carries no gradient (comparisons, logic, sources)."""
    return (None,) * len(operands)


@dataclass(frozen=True)
class BeforeFusion:
    """The VJP of a fused op: there is none, since gradients are taken of traced graphs, which
    hold no fused ops; calling it says so."""
    op_name: str

    def __call__(self, g: Tensor, out: Tensor, *operands: Tensor, **attrs: Any) -> Cotangents:
        raise TesseraError("is a fused op that rewrites produce; it has no VJP",
                           op=self.op_name, hint="write fn with the plain ops it fuses (matmul, add, an "
                                                 "activation, ...): op.grad differentiates those, and the "
                                                 "gradient's own rewrites fuse them again")


def before_fusion(op_name: str) -> BeforeFusion:
    """`OpDef(..., vjp=before_fusion("gemm"))` for an op only rewrites produce."""
    return BeforeFusion(op_name)


# ---- adding up cotangents ------------------------------------------------------------------------

def add_cotangents(a: Tensor, b: Tensor) -> Tensor:
    """a + b, the cotangents of one value used twice. Where they are zero-padded slabs of one axis
    that meet without overlapping (slices that split a tensor: q, k and v of one projection), they
    are one concatenate of the slabs, zero-padded where nothing reached, instead of full-size pads
    added up: the slices' gradient is assembled by one copy, not written and read three times over.

    >>> from tessera_rw.algebra.api import tracing
    >>> from tessera_rw.algebra.builder import make_input
    >>> with tracing():
    ...     x = SymbolicTensor(make_input("x", (2, 6), DType.float32))
    ...     dq, dk = pad_zeros(x[:, :2] * 2.0, [(0, 0), (0, 4)]), pad_zeros(x[:, 2:4] * 3.0, [(0, 0), (2, 2)])
    ...     total = add_cotangents(dq, dk)
    ...     total.node.op, total.node.args[0].op, [a.type.shape for a in total.node.args[0].args]
    ('pad', 'concatenate', [(2, 2), (2, 2)])
    """
    joined = _joined_slabs(a, b)
    return a + b if joined is None else joined


def _slab(t: Tensor) -> tuple[Tensor, tuple[tuple[int, int], ...]] | None:
    """(what a zero pad pads, its pads), or None when `t` is not a zero pad."""
    node = t.node
    if node.op != "pad" or node.attr_map["value"] != 0:
        return None
    return SymbolicTensor(node.args[0]), tuple(node.attr_map["pads"])


def _parts(t: Tensor, axis: int) -> list[Tensor]:
    """The pieces a concatenate along `axis` joined (t itself when it is none)."""
    node = t.node
    if node.op == "concatenate" and node.attr_map["axis"] == axis:
        return [SymbolicTensor(arg) for arg in node.args]
    return [t]


def _joined_slabs(a: Tensor, b: Tensor) -> Tensor | None:
    slabs = (_slab(a), _slab(b))
    if None in slabs or a.shape != b.shape or a.dtype is not b.dtype:
        return None
    (x, xp), (y, yp) = slabs
    moved = [i for i, (p, q) in enumerate(zip(xp, yp)) if p != (0, 0) or q != (0, 0)]
    if len(moved) != 1:
        return None
    axis = moved[0]
    (lo, first), (lo2, second) = sorted(((xp[axis][0], x), (yp[axis][0], y)), key=lambda p: p[0])
    if lo + first.shape[axis] != lo2:          # overlapping, or a gap between them
        return None
    joined = api.concatenate(_parts(first, axis) + _parts(second, axis), axis=axis)
    pads = [(0, 0)] * a.ndim
    pads[axis] = (lo, a.shape[axis] - lo2 - second.shape[axis])
    return pad_zeros(joined, pads)
