"""A warm call on numpy arrays skips binding and signature building, whether its arguments come
by position, by keyword or both; what the fast path cannot take goes the general way."""

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.errors import ArgumentError
from tessera_rw.kernel import Kernel

A = [np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32) for _ in range(3)]


@pytest.fixture
def no_binding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a warm call bound its arguments")
    return lambda: monkeypatch.setattr(Kernel, "bind", refuse)


@pytest.mark.parametrize("call", [lambda f: f(*A), lambda f: f(q=A[0], k=A[1], v=A[2]),
                                  lambda f: f(A[0], v=A[2], k=A[1])], ids=["positional", "keyword", "mixed"])
def test_warm_calls_by_position_or_keyword_take_the_fast_path(call, no_binding):
    f = op.kernel(lambda q, k, v: q * k + v)
    f(*A)
    no_binding()
    np.testing.assert_allclose(call(f), A[0] * A[1] + A[2], rtol=1e-6)


def test_a_keyword_call_with_a_missing_or_unknown_name_is_still_an_error():
    f = op.kernel(lambda q, k, v: q * k + v)
    f(*A)
    with pytest.raises(ArgumentError, match="missing a required argument"):
        f(A[0], k=A[1])
    with pytest.raises(ArgumentError, match="unexpected keyword argument 'w'"):
        f(A[0], k=A[1], w=A[2])


def test_a_warm_call_on_the_host_runs_the_plan_without_deciding_the_device_again(monkeypatch):
    import tessera_rw.warm_calls as warm_calls
    f = op.kernel(lambda q, k, v: q * k + v)
    f(*A)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm call went the general way")
    monkeypatch.setattr(warm_calls, "run_program", refuse)
    np.testing.assert_allclose(f(*A), A[0] * A[1] + A[2], rtol=1e-6)


def test_tessera_device_set_after_a_warm_call_still_decides(monkeypatch):
    f = op.kernel(lambda q, k, v: q * k + v)
    f(*A)
    monkeypatch.setenv("TESSERA_DEVICE", "tpu")
    with pytest.raises(ArgumentError, match="TESSERA_DEVICE='tpu' is not a device"):
        f(*A)
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    np.testing.assert_allclose(f(*A), A[0] * A[1] + A[2], rtol=1e-6)


def test_a_warm_call_runs_under_the_numerics_policy_in_force():
    from tessera_rw import numerics
    seen = []
    f = op.kernel(lambda x: op.sum(x, axis=-1))
    big = np.array([[1e8, 1.0, -1e8, 1.0] * 64], np.float32)
    for policy in ("deterministic", "kahan_sum", "deterministic", "kahan_sum"):
        with numerics.policy(policy):
            seen.append(float(f(big)[0]))
    assert seen[0] == seen[2] and seen[1] == seen[3]
    assert seen[1] == 128.0 != seen[0], seen


class _TorchDtype:
    __module__ = "torch"

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    def __eq__(self, other) -> bool:
        return isinstance(other, _TorchDtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


class _CudaTensor:
    """What a warm call reads of a torch CUDA tensor (its class's module, shape, dtype and device),
    over a numpy array."""
    __module__ = "torch"

    def __init__(self, array: np.ndarray, device: int = 0):
        self.array, self.shape, self.dtype, self.device = array, array.shape, _TorchDtype(str(array.dtype)), device
        self.is_cuda = True

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def get_device(self) -> int:
        return self.device


@pytest.fixture
def fake_gpu(monkeypatch):
    """device_plan replaced by the host executor over the tensors' arrays; the devices of the plans it made.
    numpy arrays stay on the host, GPU or not."""
    import tessera_rw.codegen.plan_runtime as plan_runtime
    import tessera_rw.execute as execute
    import tessera_rw.warm_calls as warm_calls
    for module in (execute, warm_calls):
        monkeypatch.setattr(module, "host_arrays_run_on_gpu", lambda program, numerics: False)
    from tessera_rw.codegen.cpu_executor import run_plan_on_cpu
    made = []

    class Plan:
        def __init__(self, plan, device, numerics):
            self.plan, self.numerics = plan, numerics

        def run(self, values, stream=None):
            arrays = {n: v.array if isinstance(v, _CudaTensor) else v for n, v in values.items()}
            return run_plan_on_cpu(self.plan, arrays, self.numerics)

    kept = {}

    def device_plan(plan, device, numerics, schedules=()):     # made once, kept as device_plan's cache keeps it
        if (plan, device, numerics) not in kept:
            made.append(device)
            kept[plan, device, numerics] = Plan(plan, device, numerics)
        return kept[plan, device, numerics]
    monkeypatch.setattr(plan_runtime, "device_plan", device_plan)
    return made


def test_a_warm_call_on_torch_cuda_tensors_runs_their_device_plan_without_binding(fake_gpu, no_binding, monkeypatch):
    import tessera_rw.warm_calls as warm_calls
    f = op.kernel(lambda q, k, v: q * k + v)
    tensors = [_CudaTensor(a) for a in A]
    np.testing.assert_allclose(f(*tensors)[0], (A[0] * A[1] + A[2])[0], rtol=1e-6)    # cold: the general way
    assert fake_gpu == [0]
    no_binding()

    def refuse(*args, **kwargs):
        raise AssertionError("a warm call went the general way")
    monkeypatch.setattr(warm_calls, "run_program", refuse)
    for _ in range(2):
        np.testing.assert_allclose(f(*tensors), A[0] * A[1] + A[2], rtol=1e-6)
    assert fake_gpu == [0]           # the warm calls run the plan the cold call made


def test_torch_tensors_on_another_gpu_or_mixed_gpus_are_other_signatures(fake_gpu):
    f = op.kernel(lambda q, k, v: q * k + v)
    f(*[_CudaTensor(a) for a in A])
    f(*[_CudaTensor(a, device=1) for a in A])
    assert fake_gpu == [0, 1]                        # a second GPU: its own call, its own plan
    from tessera_rw.algebra.errors import ArgumentError
    with pytest.raises(ArgumentError, match="inputs live on devices"):
        f(_CudaTensor(A[0]), _CudaTensor(A[1], device=1), _CudaTensor(A[2]))
    with pytest.raises(ArgumentError, match="inputs live on devices"):       # not remembered: refused again
        f(_CudaTensor(A[0]), _CudaTensor(A[1], device=1), _CudaTensor(A[2]))


def test_numpy_and_torch_calls_of_one_shape_are_remembered_apart(fake_gpu):
    f = op.kernel(lambda q, k, v: q * k + v)
    for _ in range(2):
        np.testing.assert_allclose(f(*A), A[0] * A[1] + A[2], rtol=1e-6)
        np.testing.assert_allclose(f(*[_CudaTensor(a) for a in A]), A[0] * A[1] + A[2], rtol=1e-6)
    assert fake_gpu == [0]                           # the numpy calls ran on the host


def test_a_call_that_failed_is_not_remembered(fake_gpu):
    import tessera_rw.codegen.plan_runtime as plan_runtime
    f = op.kernel(lambda q, k, v: q * k + v)
    tensors = [_CudaTensor(a) for a in A]
    made = plan_runtime.device_plan

    def out_of_memory(*args, **kwargs):
        raise MemoryError("out of device memory")
    plan_runtime.device_plan = out_of_memory
    try:
        with pytest.raises(MemoryError):
            f(*tensors)
    finally:
        plan_runtime.device_plan = made
    assert not f._warm_calls._calls           # the next call goes the general way again
    np.testing.assert_allclose(f(*tensors), A[0] * A[1] + A[2], rtol=1e-6)
