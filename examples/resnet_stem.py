"""A ResNet stem's training step: `op.value_and_grad` through the 7×7 stride-2 convolution, a batch
norm in training mode, the relu and the 3×3 stride-2 max pool, as torch.nn.functional writes them.

    y = max_pool2d(relu(batch_norm(conv2d(images, w, stride=2, padding=3))), 3, stride=2, padding=1)
    loss = Σ y ∘ target

- the batch norm's statistics are two reductions over the convolution's output, and one kernel
  normalizes it, scales, shifts and applies the relu (σ and the 16-bit parameters' casts computed
  where they are read), writing what the pool and its gradient read;
- the max pool is one kernel, and its gradient one more, each element of the input visiting the
  windows that cover it and taking the cotangent of those that picked it (the first of equals, as
  torch: after the relu a window of zeros sends it to one zero), the relu's mask applied as it
  writes (a `fused_max_pool2d_grad`);
- the batch norm's backward sums Σdy·x̂, Σdy and Σdy·γ/σ per channel in one multi_reduction kernel
  (x̂ computed again from the convolution's output), one kernel writes dY, and the weight
  gradient is a convolution of the images by dY reading both where they lie (a `strided_conv`).

    tessera-rewrite --explain examples/resnet_stem.py
    python examples/resnet_stem.py          # small inputs, checked by finite differences in numpy
"""

import sys

import numpy as np

from tessera_rw import op

EPS = 1e-5
PARAMETERS = ("w", "gamma", "beta")


def stem_loss(params, images, target):
    """Σ stem(images) ∘ target, the stem's parameters the dict `params`."""
    y = op.conv2d(images, params["w"], stride=2, padding=3)
    y = op.relu(op.batch_norm(y, weight=params["gamma"], bias=params["beta"], eps=EPS))
    return op.sum(op.max_pool2d(y, 3, stride=2, padding=1) * target)


stem_step = op.value_and_grad(stem_loss, argnums=0)


def example_inputs():
    """ImageNet's 224 × 224 images, 32 of them, into 64 channels, in bf16."""
    params = {"w": op.tensor((64, 3, 7, 7), "bf16"), "gamma": op.tensor((64,), "bf16"),
              "beta": op.tensor((64,), "bf16")}
    return {"params": params, "images": op.tensor((32, 3, 224, 224), "bf16"),
            "target": op.tensor((32, 64, 56, 56), "bf16")}


# ---- the same loss in plain numpy, and the check -------------------------------------------------------

def _windows(x, kernel, stride, padding, fill):
    """Each output position's window of x padded with `fill`, as (..., out_h, out_w, kh, kw)."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    view = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    return view[:, :, ::stride, ::stride]


def stem_loss_reference(params, images, target) -> float:
    """The loss in float64 numpy: the convolution as windows against the kernel, the pool as the
    windows' max."""
    w, gamma, beta = (np.asarray(params[n], np.float64) for n in PARAMETERS)
    y = np.einsum("nchwij,ocij->nohw", _windows(np.asarray(images, np.float64), 7, 2, 3, 0.0), w)
    mean, var = y.mean((0, 2, 3), keepdims=True), y.var((0, 2, 3), keepdims=True)
    y = np.maximum((y - mean) / np.sqrt(var + EPS) * gamma[:, None, None] + beta[:, None, None], 0)
    return float(np.sum(_windows(y, 3, 2, 1, -np.inf).max(axis=(-2, -1)) * np.asarray(target, np.float64)))


TOLERANCE = 2e-3        # float32 gradients against float64 central differences, relative


def directional_error(params, images, target, grads, rng: np.random.Generator) -> float:
    """The largest relative difference, one parameter at a time, between ⟨gradient, d⟩ and the
    float64 central difference of the numpy loss along d: d the gradient's direction plus a random
    one (a wrong gradient shows along itself; a missing component along the random part)."""
    wide = {name: v.astype(np.float64) for name, v in params.items()}
    worst = 0.0
    for name in PARAMETERS:
        noise = rng.standard_normal(wide[name].shape)
        d = grads[name] / max(np.linalg.norm(grads[name]), 1e-30) + noise / np.linalg.norm(noise)
        losses = [stem_loss_reference({**wide, name: wide[name] + h * d}, images, target) for h in (1e-6, -1e-6)]
        along = float(np.vdot(grads[name], d))
        error = abs((losses[0] - losses[1]) / 2e-6 - along) / abs(along) if along else np.inf
        worst = max(worst, error)
    return worst


def main() -> int:
    """The loss and gradients of 4 images of 3 × 32 × 32 into 8 channels, in float32, on the GPU if
    there is one, else the numpy executor, against the float64 numpy loss."""
    rng = np.random.default_rng(0)
    params = {"w": (rng.standard_normal((8, 3, 7, 7)) / np.sqrt(147)).astype(np.float32),
              "gamma": (1 + 0.1 * rng.standard_normal(8)).astype(np.float32),
              "beta": (0.1 * rng.standard_normal(8)).astype(np.float32)}
    images = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    target = rng.standard_normal((4, 8, 8, 8)).astype(np.float32)
    value, grads = stem_step(params, images, target)
    want = stem_loss_reference(params, images, target)
    loss_error = abs(float(value) - want) / max(1.0, abs(want))
    error = directional_error(params, images, target, {n: np.asarray(g, np.float64) for n, g in grads.items()}, rng)
    ok = loss_error < 1e-4 and error < TOLERANCE
    print(f"{stem_step.name:22s} loss {float(value):.4f} (numpy {want:.4f}), gradients along themselves "
          f"and at random, against finite differences: max error {error:.1e}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
