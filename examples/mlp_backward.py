"""The backward pass of a two-layer MLP, written out by hand.

Forward (what is being differentiated):

    pre = x W1 + b1,   h = gelu(pre),   y = h W2 + b2

Backward, given dy = ∂loss/∂y (one row per token):

    db2 = Σ_rows dy             dW2 = hᵀ dy             dh = dy W2ᵀ
    dpre = gelu'(pre) · dh      dW1 = xᵀ dpre           db1 = Σ_rows dpre       dx = dpre W1ᵀ

`op.grad(loss, argnums=...)` derives this same backward graph by reverse-mode differentiation of
the op graph, from each op's declared VJP; here it is spelled out so every kernel is visible. The
kernel recomputes `pre` from x rather than taking it saved from the forward pass: one more gemm,
and its inputs are just the forward's inputs and dy (b2 plays no part in any gradient).

What tessera_rw makes of it: five gemms (the four products above, and the recomputed x W1 + b1,
which takes its bias in its epilogue; the transposed operands are copies that feed them), no
elementwise kernel for gelu'(pre) · dh: the gemm writing dh applies it in its epilogue (`fused:
dgelu`, reading pre, as cuBLASLt's DGELU does), and no reduction kernel: each bias gradient comes
out of its weight-gradient gemm (`fused: bias_grad`), as an extra row Σ_rows dy of the same
product, so dW and db are read from one output. The recomputed pre and gelu(pre), which dW2 reads,
come out of one gemm (`fused: bias, pre, gelu`, a `gemm_pre_act`, as cuBLASLt's GELU_AUX writes
both): no elementwise kernel at all.

    tessera-rewrite --explain examples/mlp_backward.py:mlp_backward --run
    python examples/mlp_backward.py         # small inputs, checked against the numpy version below
"""

import sys

import numpy as np
from scipy.special import erf

from tessera_rw import op

INV_SQRT2 = 2 ** -0.5
INV_SQRT_2PI = (2 * np.pi) ** -0.5


@op.kernel
def mlp_backward(x, w1, b1, w2, dy):
    pre = x @ w1 + b1
    h = op.gelu(pre)

    # second layer: y = h W2 + b2
    db2 = op.sum(dy, axis=0)
    dw2 = h.T @ dy
    dh = dy @ w2.T

    # gelu(u) = u Φ(u), so gelu'(u) = Φ(u) + u φ(u) (Φ, φ: the standard normal's cdf and density)
    cdf = 0.5 * (1.0 + op.erf(pre * INV_SQRT2))
    pdf = op.exp(-0.5 * pre * pre) * INV_SQRT_2PI
    dpre = dh * (cdf + pre * pdf)

    # first layer: pre = x W1 + b1
    dw1 = x.T @ dpre
    db1 = op.sum(dpre, axis=0)
    dx = dpre @ w1.T
    return dx, dw1, db1, dw2, db2


def parameter_shapes(tokens, width, hidden):
    return {"x": (tokens, width), "w1": (width, hidden), "b1": (hidden,), "w2": (hidden, width),
            "dy": (tokens, width)}


def example_inputs():
    """GPT-2 small's MLP (768 → 3072 → 768) over 2048 tokens, in bf16."""
    return {name: op.tensor(shape, "bf16") for name, shape in parameter_shapes(2048, 768, 3072).items()}


# ---- the same gradients in plain numpy ---------------------------------------------------------------

def mlp_backward_reference(x, w1, b1, w2, dy):
    """float64 numpy (x and dy are promoted, so everything after them is)."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    pre = x @ w1 + b1
    cdf = 0.5 * (1 + erf(pre / np.sqrt(2)))
    h = pre * cdf
    dh = dy @ w2.T
    dpre = dh * (cdf + pre * np.exp(-pre ** 2 / 2) / np.sqrt(2 * np.pi))
    return dpre @ w1.T, x.T @ dpre, dpre.sum(axis=0), h.T @ dy, dy.sum(axis=0)


def numerical_gradient_check(x, w1, b1, w2, b2, dy, eps=1e-6) -> float:
    """The reference's dW1[0, 0] against a central difference of loss = Σ y · dy (float64)."""
    def loss(w1):
        pre = x @ w1 + b1
        return float(np.sum((0.5 * pre * (1 + erf(pre / np.sqrt(2))) @ w2 + b2) * dy))
    w1 = np.asarray(w1, np.float64)
    bumped = [w1.copy(), w1.copy()]
    bumped[0][0, 0] += eps
    bumped[1][0, 0] -= eps
    numeric = (loss(bumped[0]) - loss(bumped[1])) / (2 * eps)
    analytic = mlp_backward_reference(x, w1, b1, w2, dy)[1][0, 0]
    return abs(numeric - analytic) / max(abs(numeric), 1e-12)


# ---- checking the kernel against it ----------------------------------------------------------------

TOLERANCE = 1e-3        # float32 inputs; the error is measured relative to each output's largest value
NAMES = ("dx", "dw1", "db1", "dw2", "db2")


def random_parameters(rng, tokens, width, hidden):
    """float32 values; weights ~ 1/√fan_in so the pre-activations are O(1), where gelu bends."""
    p = {name: rng.standard_normal(shape).astype(np.float32)
         for name, shape in parameter_shapes(tokens, width, hidden).items()}
    p["w1"] /= np.sqrt(width)
    p["w2"] /= np.sqrt(hidden)
    return p


def max_relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    """Run the backward on 256 tokens, on the GPU if there is one, else the numpy executor."""
    rng = np.random.default_rng(0)
    params = random_parameters(rng, tokens=256, width=64, hidden=256)
    # first make sure the hand-written numpy gradients are the true ones
    finite_difference = numerical_gradient_check(**params, b2=rng.standard_normal(64))
    if finite_difference > 1e-6:
        print(f"the numpy reference's dW1 differs from a finite difference by {finite_difference:.1e}")
    errors = [max_relative_error(got, want)
              for got, want in zip(mlp_backward(**params), mlp_backward_reference(**params))]
    ok = finite_difference <= 1e-6 and max(errors) < TOLERANCE
    detail = ", ".join(f"{name} {e:.1e}" for name, e in zip(NAMES, errors))
    print(f"{mlp_backward.name:18s} max relative error {max(errors):.1e}  {'ok' if ok else 'FAILED'}  ({detail})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
