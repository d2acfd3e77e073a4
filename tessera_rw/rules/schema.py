"""How ops and their attributes look in the e-graph: constructor names, argument sorts, literals.

Every op becomes one egglog constructor (one per arity for variadic ops) named in CamelCase so it
cannot clash with egglog's primitives: `matmul` -> `Matmul`, `flash_attention` with 4 operands ->
`FlashAttention4`. Its arguments are the operand terms, then the attributes sorted by name, then
the result's shape (`Dims`, a vector of i64) and dtype (`String`). Types in every term make them
visible to rule conditions, and `shp` / `dt` give them for any e-class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.ops import opdef
from tessera_rw.algebra.opdef import OpDef

TERM_SORT = "T"
PRELUDE = f"""
(sort Dims (Vec i64))
(datatype {TERM_SORT})
(function shp ({TERM_SORT}) Dims :merge old)
(function dt ({TERM_SORT}) String :merge old)
(constructor Id (i64) {TERM_SORT})
"""


def egg_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def egg_f64(value: float | complex) -> str:
    if isinstance(value, complex):     # a real scalar met a complex tensor: 2.0 * rfft(x)
        if value.imag:
            raise TesseraError(f"the complex constant {value!r} cannot be an e-graph attribute",
                               hint="pass it as an input tensor, or write it as real and imaginary parts")
        value = value.real
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(float(value))
    return text if ("." in text or "e" in text or "n" in text) else text + ".0"


def egg_dims(values: tuple[int, ...]) -> str:
    return "(vec-of " + " ".join(str(int(v)) for v in values) + ")" if values else "(vec-empty)"


@dataclass(frozen=True)
class AttrCodec:
    """One attribute's egglog sort and its conversions (to egglog text, from a decoded literal)."""
    sort: str
    encode: Callable[[Any], str]
    decode: Callable[[Any], Any]


def _flat_pairs(pairs) -> str:
    return egg_dims(tuple(v for pair in pairs for v in pair))


def _pairs(flat) -> tuple[tuple[int, int], ...]:
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))


I64 = AttrCodec("i64", lambda v: str(int(v)), int)
F64 = AttrCodec("f64", egg_f64, float)
BOOL = AttrCodec("bool", lambda v: "true" if v else "false", bool)
STR = AttrCodec("String", egg_string, str)
DIMS = AttrCodec("Dims", lambda v: egg_dims(tuple(v)), tuple)
PAIRS = AttrCodec("Dims", _flat_pairs, _pairs)
DTYPE = AttrCodec("String", lambda v: egg_string(DType.parse(v).value), DType.parse)
OPT_DTYPE = AttrCodec("String", lambda v: egg_string("" if v is None else DType.parse(v).value),
                      lambda s: None if s == "" else DType.parse(s))

ATTRS: dict[str, AttrCodec] = {
    "name": STR, "shape": DIMS, "dtype": DTYPE, "accum_dtype": OPT_DTYPE,
    "axes": DIMS, "starts": DIMS, "stops": DIMS, "steps": DIMS, "stride": DIMS, "dilation": DIMS, "strides": DIMS,
    "sizes": DIMS, "offsets": DIMS, "shapes": DIMS, "out_strides": DIMS, "out_offsets": DIMS, "o_strides": DIMS,
    "shared": DIMS, "kernel": DIMS, "pad": DIMS, "plane": DIMS,
    "pads": PAIRS, "padding": PAIRS,
    "axis": I64, "k": I64, "groups": I64, "n": I64, "offset": I64, "parts": I64, "window": I64, "size": I64,
    "width": I64, "divisor": I64,
    "keepdims": BOOL, "causal": BOOL, "has_weight": BOOL, "has_bias": BOOL, "has_mask": BOOL, "has_residual": BOOL,
    "trans_a": BOOL, "trans_b": BOOL, "out_swapped": BOOL, "bias_grad": BOOL, "ceil_mode": BOOL,
    "count_include_pad": BOOL,
    "eps": F64, "scale": F64, "value": F64, "start": F64, "stop": F64, "step": F64,
    "norm": STR, "approximate": STR, "activation": STR, "expr": STR, "exprs": STR, "post": STR, "reduce": STR,
}
# Literal arrays are opaque leaves: the e-graph holds a key into the encoding's literal table.
LITERAL_KEY = STR


def codec(op: str, attr: str) -> AttrCodec:
    if op == "literal" and attr == "value":
        return LITERAL_KEY
    try:
        return ATTRS[attr]
    except KeyError:
        raise TesseraError(f"attribute {attr!r} of op {op!r} has no e-graph encoding",
                           hint="add it to tessera_rw.rules.schema.ATTRS") from None


def camel(op_name: str) -> str:
    return "".join(part.capitalize() for part in op_name.split("_"))


def constructor_name(op: OpDef | str, arity: int) -> str:
    op = opdef(op) if isinstance(op, str) else op
    return camel(op.name) + (str(arity) if op.variadic else "")


def attr_names(op_name: str) -> tuple[str, ...]:
    """The attributes an op's nodes carry, in constructor order (sorted by name)."""
    return opdef(op_name).attr_names


def declaration(op_name: str, arity: int) -> str:
    name = constructor_name(op_name, arity)
    sorts = [TERM_SORT] * arity + [codec(op_name, a).sort for a in attr_names(op_name)] + ["Dims", "String"]
    return f"(constructor {name} ({' '.join(sorts)}) {TERM_SORT})"


def type_rule(op_name: str, arity: int) -> str:
    """Fill the `shp` / `dt` analyses from the type every term carries."""
    name = constructor_name(op_name, arity)
    args = " ".join(f"a{i}" for i in range(arity + len(attr_names(op_name))))
    return f"(rule ((= e ({name} {args} s d))) ((set (shp e) s) (set (dt e) d)) :ruleset types)"
