"""The convolution rows of `python -m bench gpu`: a ResNet basic block, forward and training step.

    h = relu(conv3x3(x, w1) + b1);  y = relu(conv3x3(h, w2) + b2 + x)        (N=32, C=64, 56 x 56, bf16)

Ours is the `@op.kernel` call on torch CUDA tensors, as a user makes it: the forward is two
fused_conv kernels (bias, residual and relu in the epilogues); the training step (`op.grad` of
Σ y ∘ dy for x and every weight) is 6 kernels, its weight gradients reading xᵀ and dYᵀ in place,
writing dW in its own layout and db beside it, and dx reading the kernels flipped in place, the relu
masks in its epilogues. torch runs the same block as written, NCHW, on cuDNN
(F.conv2d, the bias and residual adds and relus as separate kernels; autograd for the gradients).
"""

from __future__ import annotations

from typing import Callable

from bench.gpu import Ceilings
from bench.gpu_backward import grads_checked
from bench.gpu_results import Result, error_line
from bench.gpu_timing import Protocol, rel_error, time_torch
from tessera_rw import op

N, C, SIZE = 32, 64, 56
FORWARD_NAME = f"ResNet basic block bf16 N={N} C={C} {SIZE}x{SIZE} (2 fused_conv) vs torch conv2d+bias+relu"
TRAINING_NAME = f"ResNet basic block training step bf16 N={N} C={C} {SIZE}x{SIZE} vs torch fwd+autograd.grad"
TOLERANCE = 2e-2         # bf16 activations over a 576-long reduction, twice


def block(conv, relu, x, w1, b1, w2, b2):
    """The basic block over either library's conv2d (padding 1) and relu."""
    h = relu(conv(x, w1) + b1)
    return relu(conv(h, w2) + b2 + x)


@op.kernel
def resnet_block(x, w1, b1, w2, b2):
    return block(lambda a, w: op.conv2d(a, w, padding=1), op.relu, x, w1, b1, w2, b2)


def _loss(x, w1, b1, w2, b2, dy):
    return op.sum(resnet_block(x, w1, b1, w2, b2) * dy)


def conv_rows(protocol: Protocol, ceilings: Ceilings) -> list[tuple[str, Callable[[], Result]]]:
    """The rows, each as (its name, the call that times it)."""
    return [(FORWARD_NAME, lambda: forward(protocol, ceilings)), (TRAINING_NAME, lambda: training(protocol, ceilings))]


def _flops_and_bytes(convs: int, activations: int) -> tuple[int, int]:
    return convs * 2 * N * C * SIZE * SIZE * C * 9, activations * N * C * SIZE * SIZE * 2 + 2 * C * C * 9 * 2


def _inputs():
    """x, w1, b1, w2, b2 and dy on the GPU: kernels ~ 1/√fan_in, small biases."""
    import torch
    act = (N, C, SIZE, SIZE)
    x, dy = (torch.randn(act, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w1, w2 = (torch.randn(C, C, 3, 3, dtype=torch.bfloat16, device="cuda") / (9 * C) ** 0.5 for _ in range(2))
    b1, b2 = (0.1 * torch.randn(C, 1, 1, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    return x, w1, b1, w2, b2, dy


def _torch_block(*args):
    import torch
    import torch.nn.functional as F
    return block(lambda a, w: F.conv2d(a, w, padding=1), torch.relu, *args)


def forward(protocol: Protocol, ceilings: Ceilings) -> Result:
    flops, io_bytes = _flops_and_bytes(2, 3)            # x read, y written, h written and read back once
    result = Result(FORWARD_NAME, floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        x, w1, b1, w2, b2, _ = _inputs()
        params = (x, w1, b1, w2, b2)
        ours = resnet_block(*params)
        want = _torch_block(*(a.double() for a in params))
        result.error, result.torch_error = rel_error(ours, want), rel_error(_torch_block(*params), want)
        if result.error > TOLERANCE:
            result.status = "FAILED: wrong on random data"
            return result
        kernels = resnet_block.program(*params).candidate.kernels
        result.notes.append("ours: " + " -> ".join(f"{k.op.op}[{','.join(k.fused)}]" for k in kernels))
        result.ours = time_torch(lambda: resnet_block(*params), protocol)
        result.torch = time_torch(lambda: _torch_block(*params), protocol)
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


def training(protocol: Protocol, ceilings: Ceilings) -> Result:
    flops, io_bytes = _flops_and_bytes(6, 6)            # 2 forward, 4 backward convs; x, dy, h, dx and more
    result = Result(TRAINING_NAME, floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        import torch
        *params, dy = _inputs()
        grad = op.grad(_loss, argnums=(0, 1, 2, 3, 4))
        ours = grad(*params, dy)
        leaves = [a.detach().clone().requires_grad_(True) for a in params]

        def library():
            return torch.autograd.grad(_torch_block(*leaves), leaves, dy)
        if not grads_checked(result, ours, library(), _torch_block, params, dy):
            return result
        kernels = grad.program(*params, dy).candidate.kernels
        result.notes.append(f"ours: {len(kernels)} kernels, " + " -> ".join(k.op.op for k in kernels))
        result.ours = time_torch(lambda: grad(*params, dy), protocol)
        result.torch = time_torch(library, protocol)
        torch.cuda.empty_cache()
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result
