"""A convolution absorbs the elementwise work after it (part of the `epilogue` ruleset):

    f(…, conv(x, w), …) = fused_conv(x, w, …; post=f)

where f is a fused_elementwise node reading the convolution's output as one of its inputs, of the
same shape and dtype as f's result (an epilogue that broadcasts the output wider, or casts it to
another dtype, stays a kernel of its own). A ResNet block's bias, residual and relu ride in the
convolution's accumulators instead of a pass over the activations each: 4 kernels a block become 2.
The rest of f's inputs (a bias, a residual) follow x and w, in f's order.
"""

from __future__ import annotations

import numpy as np

from tessera_rw.algebra import api as op
from tessera_rw.algebra.ops.fused_expr import MAX_FUSED_INPUTS
from tessera_rw.rules.library.example_inputs import rand
from tessera_rw.rules.library.fusion import ALL_FUSION_RULE_NAMES, expression_over, renumbered, with_parameters
from tessera_rw.rules.pattern import TermBuilder
from tessera_rw.rules.rule import Rule

t = TermBuilder()
s, d, e_out, x, w, st, pd, dl, gr = t.vars("s d e_out x w st pd dl gr")
T = (s, d)


def _example(spatial: int, n: int, k: int):
    """expression_over(…, conv(x, w) at position k, …) of random inputs: a per-channel bias first
    among the others, full-size tensors after it, stride and groups drawn."""
    def example(rng: np.random.Generator):
        groups = int(rng.integers(1, 3))
        c, o = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
        size = tuple(int(v) for v in rng.integers(3, 7, size=spatial))
        kernel = tuple(int(v) for v in rng.integers(1, 4, size=spatial))
        stride = int(rng.integers(1, 3))
        attrs = dict(stride=stride, padding=1, groups=groups)
        conv = op.conv1d if spatial == 1 else op.conv2d
        out = tuple((a + 2 - b) // stride + 1 for a, b in zip(size, kernel))
        names = [f"y{i}" for i in range(n - 1)]
        inputs = {"x": rand(rng, 2, c, *size), "w": rand(rng, o, c // groups, *kernel)}
        inputs |= {nm: rand(rng, o, *(1,) * spatial) if i == 0 else rand(rng, 2, o, *out) for i, nm in enumerate(names)}

        def body(x, w, *rest):
            rest = list(rest)
            return expression_over(rest[:k] + [conv(x, w, **attrs)] + rest[k:])
        return with_parameters(body, ["x", "w", *names]), inputs
    return example


def _rules():
    for spatial, conv in ((1, "conv1d"), (2, "conv2d")):
        for n in range(1, MAX_FUSED_INPUTS + 1):
            ys = t.vars(" ".join(f"y{i}" for i in range(n)))
            for k in range(n):
                attrs = dict(stride=st, padding=pd, dilation=dl, groups=gr)
                outer = [t.term(conv, x, w, **attrs, of=T) if i == k else ys[i] for i in range(n)]
                post = renumbered("e_out", {i: "#0" if i == k else f"#{i + 1 if i < k else i}" for i in range(n)})
                yield Rule(f"{conv}-into-input-{k}-of-{n}", f"f(…, {conv}(x, w), …) = fused_conv(x, w, …; f)",
                           lhs=t.fused_elementwise(*outer, expr=e_out, of=T),
                           rhs=t.fused_conv(x, w, *(ys[i] for i in range(n) if i != k), **attrs, post=post, of=T),
                           example=_example(spatial, n, k), needs=ALL_FUSION_RULE_NAMES)


CONV_EPILOGUE_RULES = tuple(_rules())
