"""The backward-pass rows of `python -m bench gpu`: gradient-reduction fusion against torch.

- A linear layer's weight and bias gradients (X 8192×4096, dY 8192×4096 bf16: W is 4096×4096):
  ours is one GEMM whose extra row is Σ dY (matmul_bias_grad), torch runs `x.T @ dy` and
  `dy.sum(0)`. Target: faster than torch.
- Attention's gradients (B=4, H=16, S=4096, D=64 and 128, causal and not): ours is `op.grad` of
  Σ attention(q, k, v) ∘ w, i.e. the forward (O and each row's logsumexp), the row statistics
  read off it and flash_attention_bwd;
  torch runs SDPA forward and its backward (`torch.autograd.grad`) on the same inputs, so both
  sides compute O and then dQ, dK, dV. Then the backward alone under the `fast` policy, which lets
  the key blocks sum dQ with atomics as SDPA's backward does: ours is the gradient plan's steps
  after the forward (the row statistics, flash_attention_bwd), each timed by CUDA events through the
  profiler; torch's is `torch.autograd.grad` of one SDPA forward kept (`retain_graph`). Target:
  the backward at least half torch's speed. The full run times the default (`deterministic`)
  backward alone too, and at D=128, on sm_90, the same with the backward pinned to the mma.sync
  kernel the wgmma one replaced there (both kernels, one run).
- A layer norm's gradients (T=8192, D=4096 bf16): ours is `op.grad` of Σ layernorm(x, w, b) ∘ dy, dx
  from one norm_backward row kernel and dW, db from fused reductions; torch runs its layer-norm
  backward on a kept forward. No target: the ratio is recorded.
- A GELU MLP's gradients (4096 tokens, 2048 → 8192 → 2048, bf16): ours is `op.grad` of
  Σ (gelu(x W1 + b1) W2) ∘ dy, whose dz gemm applies gelu'(pre) in its epilogue and whose weight
  gradients carry the bias gradient; torch runs the forward and `torch.autograd.grad`. No target:
  the ratio is recorded.

Both are `@op.kernel` calls on torch CUDA tensors, as a user makes them, timed like torch's calls.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

from bench.gpu import Ceilings
from bench.gpu_rows import kept_band
from bench.gpu_results import Result, error_line
from bench.gpu_timing import Protocol, Timing, rel_error, time_torch
from tessera_rw import numerics, op, profiler
from tessera_rw.algebra.ops.attention import causal_pairs
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.codegen.numerics import Numerics
from tessera_rw.codegen.plan_runtime import run_plan_on_gpu
from tessera_rw.codegen.templates.attention_backward import FlashAttentionBwdTemplate
from tessera_rw.codegen.templates.attention_backward_problem import WarpgroupGradientSchedule
from tessera_rw.tune.cost import schedule_cost

TOKENS, D_IN, D_OUT = 8192, 4096, 4096
LINEAR_NAME = f"linear backward dW+db bf16 X {TOKENS}x{D_IN}, W {D_IN}x{D_OUT} vs torch x.T@dy, dy.sum(0)"
TOLERANCE = 2e-2          # ‖out − ref‖ / ‖ref‖ of bf16 gradients


@op.kernel
def linear_weight_and_bias_grads(x, dy):
    return x.T @ dy, op.sum(dy, axis=0)


def _attention_loss(causal: bool, window: int = 0):
    def loss(q, k, v, w):
        return op.sum(op.flash_attention(q, k, v, causal=causal, window=window or None) * w)
    loss.__name__ = f"attention_loss{'_causal' if causal else ''}{f'_window{window}' if window else ''}"
    return loss


def _sdpa(q, k, v, causal: bool, window: int = 0):
    """torch's SDPA of q, k, v; a sliding window as the bool band a model without a windowed
    kernel hands it."""
    import torch.nn.functional as F
    if window:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=kept_band(q.shape[-2], window, q.device))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


MLP_TOKENS, MLP_WIDTH, MLP_HIDDEN = 4096, 2048, 8192
MLP_NAME = f"MLP backward bf16 gelu T={MLP_TOKENS} {MLP_WIDTH}->{MLP_HIDDEN}->{MLP_WIDTH} vs torch fwd+autograd.grad"


def _mlp_loss(x, w1, b1, w2, dy):
    return op.sum((op.gelu(x @ w1 + b1) @ w2) * dy)


def mlp_backward(protocol: Protocol, ceilings: Ceilings) -> Result:
    t, d, h = MLP_TOKENS, MLP_WIDTH, MLP_HIDDEN
    # forward 2 products, backward 4 (dh, dW2, dx, dW1): each 2·T·D·H
    flops = 6 * 2 * t * d * h
    io_bytes = 2 * (2 * t * d + 2 * d * h + h) * 2     # x, dy, W1, W2, b1 read; their gradients written
    result = Result(MLP_NAME,
                    floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        import torch
        import torch.nn.functional as F
        grad = op.grad(_mlp_loss, argnums=(0, 1, 2, 3))
        x = torch.randn(t, d, dtype=torch.bfloat16, device="cuda")
        w1 = torch.randn(d, h, dtype=torch.bfloat16, device="cuda") / d ** 0.5
        b1 = torch.randn(h, dtype=torch.bfloat16, device="cuda")
        w2 = torch.randn(h, d, dtype=torch.bfloat16, device="cuda") / h ** 0.5
        dy = torch.randn(t, d, dtype=torch.bfloat16, device="cuda")
        ours = grad(x, w1, b1, w2, dy)
        leaves = [a.detach().clone().requires_grad_(True) for a in (x, w1, b1, w2)]

        def library():
            out = F.gelu(leaves[0] @ leaves[1] + leaves[2]) @ leaves[3]
            return torch.autograd.grad(out, leaves, dy)
        if not grads_checked(result, ours, library(), lambda x, w1, b1, w2: F.gelu(x @ w1 + b1) @ w2,
                              (x, w1, b1, w2), dy):
            return result
        kernels = grad.program(x, w1, b1, w2, dy).candidate.kernels
        result.notes.append("ours: the plan " + " -> ".join(k.op.op + (f"[{','.join(k.fused)}]" if k.fused else "")
                                                             for k in kernels))
        result.ours = time_torch(lambda: grad(x, w1, b1, w2, dy), protocol)
        result.torch = time_torch(library, protocol)
        torch.cuda.empty_cache()
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


LN_TOKENS, LN_WIDTH = 8192, 4096
LAYERNORM_NAME = f"layernorm backward dx+dW+db bf16 T={LN_TOKENS} D={LN_WIDTH} vs torch autograd.grad"


def _layernorm_loss(x, w, b, dy):
    return op.sum(op.layernorm(x, w, b) * dy)


def layernorm_inputs(t: int, d: int):
    """x, w, b and dy of a bf16 layer norm over rows of d, on the GPU: weights near 1, biases near 0."""
    import torch
    x = torch.randn(t, d, dtype=torch.bfloat16, device="cuda")
    w = 1 + 0.1 * torch.randn(d, dtype=torch.bfloat16, device="cuda")
    b = 0.1 * torch.randn(d, dtype=torch.bfloat16, device="cuda")
    return x, w, b, torch.randn(t, d, dtype=torch.bfloat16, device="cuda")


def layernorm_backward(protocol: Protocol, ceilings: Ceilings) -> Result:
    t, d = LN_TOKENS, LN_WIDTH
    flops = 20 * t * d                                  # statistics, x̂, the two row sums, dx; dW and db
    io_bytes = 2 * (3 * t * d + 4 * d)                  # x and dy read, dx written; w read, dw and db written
    result = Result(LAYERNORM_NAME,
                    floor_ms=ceilings.floor_ms(flops, io_bytes), work=io_bytes, rate_unit="GB/s")
    try:
        import torch
        import torch.nn.functional as F
        grad = op.grad(_layernorm_loss, argnums=(0, 1, 2))
        x, w, b, dy = layernorm_inputs(t, d)
        ours = grad(x, w, b, dy)
        leaves = [a.detach().clone().requires_grad_(True) for a in (x, w, b)]
        out = F.layer_norm(leaves[0], (d,), leaves[1], leaves[2])
        library = lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)      # noqa: E731
        if not grads_checked(result, ours, library(), lambda x, w, b: F.layer_norm(x, (d,), w, b), (x, w, b), dy):
            return result
        steps = [s.op for s in grad.program(x, w, b, dy).plan.steps]
        result.notes.append("ours: the plan " + " -> ".join(steps) + "; torch: its backward alone (forward kept)")
        result.ours = time_torch(lambda: grad(x, w, b, dy), protocol)
        result.torch = time_torch(library, protocol)
        torch.cuda.empty_cache()
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
        return result
    try:                           # the timings above stand whatever happens here
        result.notes.append("ours per step (profiler, one warm call): " + per_step(lambda: grad(x, w, b, dy)))
    except Exception as e:
        result.notes.append(f"the per-step profile failed: {error_line(e)}")
    return result


def per_step(call) -> str:
    """Each kernel of one warm call of `call`, as the profiler times it: 'reduction 12 µs, ...'."""
    call()
    with profiler.session() as p:
        call()
    return ", ".join(f"{r.name} {r.duration_ns / 1e3:,.0f} µs" for r in p.records)


def grads_checked(result: Result, ours, theirs, forward, inputs, dy) -> bool:
    """Our and torch's gradients of Σ forward(*inputs) ∘ dy against float64 autograd, into `result`;
    False, with the status set, when ours are wrong."""
    import torch
    wide = [a.double().requires_grad_(True) for a in inputs]
    want = torch.autograd.grad(forward(*wide), wide, dy.double())
    result.error = max(rel_error(g, r) for g, r in zip(ours, want))
    result.torch_error = max(rel_error(g, r) for g, r in zip(theirs, want))
    if result.error > TOLERANCE:
        result.status = "FAILED: wrong on random data"
        return False
    return True


def linear_backward(protocol: Protocol, ceilings: Ceilings) -> Result:
    flops = 2 * TOKENS * D_IN * D_OUT + TOKENS * D_OUT
    io_bytes = 2 * (TOKENS * D_IN + TOKENS * D_OUT + D_IN * D_OUT + D_OUT)
    result = Result(LINEAR_NAME,
                    floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        import torch
        x = torch.randn(TOKENS, D_IN, dtype=torch.bfloat16, device="cuda")
        dy = torch.randn(TOKENS, D_OUT, dtype=torch.bfloat16, device="cuda")
        dw, db = linear_weight_and_bias_grads(x, dy)
        want_dw, want_db = x.double().T @ dy.double(), dy.double().sum(0)
        result.error = max(rel_error(dw, want_dw), rel_error(db, want_db))
        library = lambda: (x.T @ dy, dy.sum(0))          # noqa: E731
        got = library()
        result.torch_error = max(rel_error(got[0], want_dw), rel_error(got[1], want_db))
        del want_dw, got
        if result.error > TOLERANCE:
            result.status = "FAILED: wrong on random data"
            return result
        steps = [s.op for s in linear_weight_and_bias_grads.program(x, dy).plan.steps]
        result.notes.append("ours: the plan " + " -> ".join(steps))
        result.ours = time_torch(lambda: linear_weight_and_bias_grads(x, dy), protocol)
        result.torch = time_torch(library, protocol)
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


def attention_backward(b: int, h: int, s: int, d: int, causal: bool, protocol: Protocol, ceilings: Ceilings,
                       window: int = 0) -> Result:
    # the usual count: forward 2 products, backward 5, of 2·S·D per (query, key) pair kept
    flops = 7 * 2 * b * h * d * (causal_pairs(s, s, window) if causal else s * s)
    io_bytes = 2 * b * h * s * d * (4 + 3)             # q, k, v, w read; dq, dk, dv written
    result = Result(attention_name("fwd+bwd", b, h, s, d, causal, window=window),
                    floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        import torch
        grad = op.grad(_attention_loss(causal, window), argnums=(0, 1, 2))
        q, k, v, w = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda") for _ in range(4))
        ours = grad(q, k, v, w)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

        def library():
            return torch.autograd.grad(_sdpa(*leaves, causal, window), leaves, w)
        if not _checked(result, ours, library(), q, k, v, w, causal, window):
            return result
        steps = [st.op for st in grad.program(q, k, v, w).plan.steps]
        result.notes.append("ours: the plan " + " -> ".join(steps))
        result.ours = time_torch(lambda: grad(q, k, v, w), protocol)
        result.torch = time_torch(library, protocol)
        torch.cuda.empty_cache()
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


def attention_backward_only(b: int, h: int, s: int, d: int, causal: bool, protocol: Protocol,
                            ceilings: Ceilings, policy: str = "fast", mma_sync: bool = False) -> Result:
    # the backward's 5 products of 2·S·S·D per head (half under a causal mask)
    flops = 5 * 2 * b * h * s * s * d * (0.5 if causal else 1.0)
    io_bytes = 2 * b * h * s * d * (5 + 3)             # q, k, v, o, dO read; dq, dk, dv written
    result = Result(attention_name("bwd", b, h, s, d, causal, policy, mma_sync),
                    floor_ms=ceilings.floor_ms(flops, io_bytes), work=flops)
    try:
        import torch
        import torch.nn.functional as F
        q, k, v, w = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda") for _ in range(4))
        with numerics.policy(policy):
            grad = op.grad(_attention_loss(causal), argnums=(0, 1, 2))
            program = grad.program(q, k, v, w)
            plan = program.plan
            if mma_sync:
                call = partial(run_plan_on_gpu, plan, dict(zip([n for n, _ in plan.inputs], (q, k, v, w))),
                               numerics=Numerics(policy), schedules=mma_sync_pin(program, Numerics(policy)))
                grad = lambda *_: call()      # noqa: E731
            ours = grad(q, k, v, w)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        library = lambda: torch.autograd.grad(out, leaves, w, retain_graph=True)      # noqa: E731
        if not _checked(result, ours, library(), q, k, v, w, causal):
            return result
        backward = {i for i, step in enumerate(plan.steps) if step.op not in ("flash_attention", "flash_attention_lse")}
        result.notes.append("ours: the steps " + " -> ".join(plan.steps[i].op for i in sorted(backward))
                            + f" of the {policy} gradient plan" + (", the backward on mma.sync" if mma_sync else ""))
        with numerics.policy(policy):
            result.ours = time_steps(lambda: grad(q, k, v, w), backward, len(plan.steps), protocol)
        result.torch = time_torch(library, protocol)
        torch.cuda.empty_cache()
    except Exception as e:
        result.status = f"ERROR {error_line(e)}"
    return result


def mma_sync_pin(program, policy: Numerics) -> tuple[tuple[int, object], ...]:
    """`program`'s schedules with its attention backward on the mma.sync kernel (the fixed-order
    form) the cost model ranks first."""
    template = FlashAttentionBwdTemplate()
    step = next(i for i, st in enumerate(program.plan.steps) if st.op == "flash_attention_bwd")
    backward = KernelOp.from_node(program.plan.steps[step].node, policy)
    options = [s for s in template.schedules(backward, program.arch)
               if not isinstance(s, WarpgroupGradientSchedule) and not s.atomic]
    best = min(options, key=lambda s: schedule_cost(template, backward, s, program.arch).est_us)
    return tuple(sorted((dict(program.schedules) | {step: best}).items()))


def _checked(result: Result, ours, theirs, q, k, v, w, causal: bool, window: int = 0) -> bool:
    """Our and torch's attention gradients against float64 into `result`; False, with the status
    set, when ours are wrong."""
    want = float64_attention_grads(q, k, v, w, causal, window)
    result.error = max(rel_error(g, r) for g, r in zip(ours, want))
    result.torch_error = max(rel_error(g, r) for g, r in zip(theirs, want))
    if result.error > TOLERANCE:
        result.status = "FAILED: wrong on random data"
        return False
    return True


def time_steps(call, steps: set[int], count: int, protocol: Protocol, batches: int = 2) -> Timing:
    """The time of some of a plan's steps per call: `call` runs the plan (`count` steps) under the
    profiler, whose CUDA events bracket each step; per call, the durations of `steps` summed.
    No flush between calls: a flush is a launch of its own, and would sit between the steps."""
    for _ in range(protocol.warmup):
        call()
    runs = []
    for _ in range(batches):
        with profiler.session() as p:
            for _ in range(protocol.reps):
                call()
        records = p.records
        if len(records) != count * protocol.reps:
            raise RuntimeError(f"the profiler saw {len(records)} launches, not {count} per call")
        runs.append([sum(r.duration_ns for r in records[i * count:(i + 1) * count] if r.step in steps) / 1e6
                     for i in range(protocol.reps)])
    return Timing.of(runs[0], runs[-1])


def float64_attention_grads(q, k, v, w, causal: bool, window: int = 0):
    """dQ, dK, dV of Σ SDPA(q, k, v) ∘ w in float64 (torch's math kernel), one batch item at a
    time: the float64 scores of all of them would not fit beside the rest."""
    import torch
    grads = [torch.empty(t.shape, dtype=torch.float64, device=t.device) for t in (q, k, v)]
    for i in range(q.shape[0]):
        wide = [t[i:i + 1].double().requires_grad_(True) for t in (q, k, v)]
        out = _sdpa(*wide, causal, window)
        for g, got in zip(grads, torch.autograd.grad(out, wide, w[i:i + 1].double())):
            g[i:i + 1] = got
    return grads


def attention_name(part: str, b: int, h: int, s: int, d: int, causal: bool, policy: str = "",
                   mma_sync: bool = False, window: int = 0) -> str:
    """An attention row's name: its fwd+bwd against SDPA's, or its bwd alone under `policy`."""
    shape = (f"attention {part} bf16 B={b} H={h} S={s} D={d}{' causal' if causal else ''}"
             f"{f' window={window}' if window else ''}")
    if part == "fwd+bwd":
        return f"{shape} vs SDPA fwd+bwd"
    return f"{shape} {policy}{' mma.sync (pinned)' if mma_sync else ''} vs SDPA backward"


def backward_rows(protocol: Protocol, ceilings: Ceilings, quick: bool) -> list[tuple[str, Callable[[], Result]]]:
    """The backward rows, each as (its name, the call that times it): a run that takes only some
    rows (`bench gpu --only`) picks them by name before any is timed."""
    shapes = [(4, 16, 4096, 64, True)] if quick else [(4, 16, 4096, d, c) for d in (64, 128) for c in (False, True)]
    found = [(LINEAR_NAME, lambda: linear_backward(protocol, ceilings)),
             (MLP_NAME, lambda: mlp_backward(protocol, ceilings)),
             (LAYERNORM_NAME, lambda: layernorm_backward(protocol, ceilings))]
    found += [(attention_name("fwd+bwd", *shape), partial(attention_backward, *shape, protocol, ceilings))
              for shape in shapes]
    if not quick:       # Mistral's sliding window: SDPA takes the band as a mask
        found += [(attention_name("fwd+bwd", 4, 16, 4096, 128, True, window=1024),
                   partial(attention_backward, 4, 16, 4096, 128, True, protocol, ceilings, window=1024))]
    policies = [("fast", False)] + ([] if quick else [("deterministic", False), ("deterministic", True)])
    found += [(attention_name("bwd", *shape, policy, pinned),
               partial(attention_backward_only, *shape, protocol, ceilings, policy, mma_sync=pinned))
              for policy, pinned in policies for shape in shapes if not pinned or shape[3] == 128]
    return found
