"""A warm call on numpy arrays skips binding and signature building, whether its arguments come
by position, by keyword or both; what the fast path cannot take goes the general way."""

import numpy as np
import pytest

from tessera_rw import op
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
    with pytest.raises(Exception, match="missing a required argument"):
        f(A[0], k=A[1])
    with pytest.raises(Exception, match="unexpected keyword argument 'w'"):
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
    with pytest.raises(Exception, match="TESSERA_DEVICE='tpu' is not a device"):
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
