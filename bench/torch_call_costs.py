"""`python -m bench.torch_call_costs` (on a GPU with torch): what a warm call on torch CUDA tensors costs the
host, against the kernels it launches and torch doing the same work: a layer norm backward (op.grad) at a
small and a large shape, and a 4x64 elementwise @op.kernel beside the same torch expression; then a call
under a side stream. Host µs: the calls enqueued back to back; with the GPU: until the last one finished."""
import time
import torch
import torch.nn.functional as F
from bench.gpu_backward import layernorm_inputs
from tessera_rw import op, profiler
from tessera_rw.codegen.plan_runtime import device_plan
from tessera_rw.codegen.numerics import Numerics


def loss(x, w, b, dy):
    return op.sum(op.layernorm(x, w, b) * dy)


def wall(call, n=300):
    call(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t) / n * 1e6, (time.perf_counter() - t) / n * 1e6


@op.kernel
def scale_add(x, y):
    return x * 2.0 + y


for t_, d in [(8, 64), (8192, 4096)]:
    grad = op.grad(loss, argnums=(0, 1, 2))
    x, w, b, dy = layernorm_inputs(t_, d)
    ours = grad(x, w, b, dy)
    plan = grad.program(x, w, b, dy).plan
    values = dict(zip([n for n, _ in plan.inputs], (x, w, b, dy)))
    leaves = [a.detach().clone().requires_grad_(True) for a in (x, w, b)]
    out = F.layer_norm(leaves[0], (d,), leaves[1], leaves[2])
    theirs = torch.autograd.grad(out, leaves, dy, retain_graph=True)
    err = max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(ours, theirs))
    print(f"layernorm backward T={t_} D={d}: steps {[s.op for s in plan.steps]}, max rel error vs torch {err:.1e}")
    print("  grad call        host %6.1f µs, with the GPU %6.1f µs per call" % wall(lambda: grad(x, w, b, dy)))
    dp = device_plan(plan, 0, Numerics.DETERMINISTIC)
    print("  DevicePlan.run   host %6.1f µs, with the GPU %6.1f µs" % wall(lambda: dp.run(values)))
    print("  torch backward   host %6.1f µs, with the GPU %6.1f µs" % wall(
        lambda: torch.autograd.grad(out, leaves, dy, retain_graph=True)))
    with profiler.session() as p:
        grad(x, w, b, dy)
    print("  kernels:", ", ".join(f"{r.name} {r.duration_ns/1e3:.1f} µs" for r in p.records))

x = torch.randn(4, 64, device="cuda")
y = torch.randn(4, 64, device="cuda")
assert torch.allclose(scale_add(x, y), x * 2 + y)
print("elementwise 4x64 f32 @op.kernel on torch: host %.1f µs, with the GPU %.1f µs" % wall(lambda: scale_add(x, y)))
print("the same in torch (x * 2 + y): host %.1f µs, with the GPU %.1f µs" % wall(lambda: x * 2 + y))
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    z = scale_add(x, y)
s.synchronize()
assert torch.allclose(z, x * 2 + y), "a call under a side stream"
print("a call under torch.cuda.stream(side): ok")
