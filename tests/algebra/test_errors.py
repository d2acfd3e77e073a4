"""Every bad-input case raises a TesseraError subclass naming op, shapes, dtypes and the user's line."""

import numpy as np
import pytest

from tessera_rw import (ArgumentError, AxisError, DTypeError, ResultError, ShapeError, TesseraError, op)

X = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)


def test_shape_mismatch_names_op_shapes_dtypes_and_line():
    @op.kernel
    def f(a, b):
        return a @ b  # the offending line

    with pytest.raises(ShapeError) as info:
        f(X, X)
    msg = str(info.value)
    assert msg.startswith("matmul:")
    assert "f32[2,3]" in msg and "(2, 3) @ (2, 3)" in msg
    assert "test_errors.py" in msg and "return a @ b  # the offending line" in msg
    assert info.value.op == "matmul"


def test_broadcast_mismatch_in_eager_call():
    with pytest.raises(ShapeError) as info:
        op.add(X, np.ones((4,), np.float32))
    msg = str(info.value)
    assert msg.startswith("add:") and "f32[2,3]" in msg and "f32[4]" in msg and "broadcast" in msg
    assert "test_errors.py" in msg


@pytest.mark.parametrize("call", [
    lambda x: op.sum(x, axis=2),
    lambda x: op.softmax(x, axis=-3),
    lambda x: op.swapaxes(x, 0, 5),
    lambda x: op.layernorm(x, axis=7),
])
def test_bad_axis(call):
    with pytest.raises(AxisError) as info:
        call(op.tensor((2, 3), "bf16"))
    msg = str(info.value)
    assert "bf16[2,3]" in msg and "axis" in msg and "test_errors.py" in msg


def test_unknown_dtype():
    with pytest.raises(DTypeError) as info:
        op.tensor((2,), "float13")
    assert "float13" in str(info.value) and "bfloat16" in str(info.value)
    with pytest.raises(DTypeError) as info:
        op.cast(X, "int7")
    assert str(info.value).startswith("cast:") and "f32[2,3]" in str(info.value)


def test_op_rejects_a_dtype():
    with pytest.raises(DTypeError) as info:
        op.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))
    assert "matmul" in str(info.value) and "i32[2,2]" in str(info.value)


def test_non_tensor_argument():
    @op.kernel
    def f(x, y):
        return x + y

    with pytest.raises(ArgumentError) as info:
        f(X, {1, 2})
    msg = str(info.value)
    assert "'y'" in msg and "set" in msg and "kernel f" in msg and "test_errors.py" in msg


@pytest.mark.parametrize("bad, kind", [([1.0, 2.0], "list"), ({"a": 1}, "dict")])
def test_a_container_argument_used_as_a_tensor_names_the_op_and_line(bad, kind):
    @op.kernel
    def f(x, y):
        return x + y                   # containers are arguments (model parameters); this one is no tensor

    with pytest.raises(ArgumentError) as info:
        f(X, bad)
    msg = str(info.value)
    assert msg.startswith(f"add: got a {'Python ' if kind == 'list' else ''}{kind}") and "return x + y" in msg


@pytest.mark.parametrize("bad, kind", [("text", "str"), (None, "NoneType")])
def test_static_argument_used_as_a_tensor(bad, kind):
    @op.kernel
    def f(x, y):
        return x + y  # y is baked in as a Python value, then used as a tensor

    with pytest.raises(ArgumentError) as info:
        f(X, bad)
    msg = str(info.value)
    assert msg.startswith("add:") and kind in msg and "f32[2,3]" in msg and "return x + y" in msg


def test_non_tensor_operand_in_eager_op():
    with pytest.raises(ArgumentError) as info:
        op.exp("x")
    assert "str" in str(info.value)


@pytest.mark.parametrize("result, says", [(None, "NoneType"), (3.0, "float"), (("x", 1), "tuple")])
def test_function_returning_a_non_tensor(result, says):
    def g(x):
        _ = x + 1
        return result

    with pytest.raises(ResultError) as info:
        op.kernel(g)(X)
    msg = str(info.value)
    assert says in msg and "g returned" in msg and "test_errors.py" in msg


def test_returning_a_captured_array_says_it_is_a_constant_of_the_trace():
    captured = np.ones((3, 3), np.float32)
    with pytest.raises(ResultError, match=r"returned ndarray, not tensors: an array it captured(.|\n)*hint: pass the "
                                          r"array in as an argument"):
        op.kernel(lambda x: captured * 2)(X)


def test_python_control_flow_on_tensors_is_explained():
    @op.kernel
    def f(x):
        return x if x > 0 else -x

    with pytest.raises(ArgumentError) as info:
        f(X)
    assert "op.where" in str(info.value) and "test_errors.py" in str(info.value)    # the user's line

    @op.kernel
    def g(x):
        return op.exp(x) * float(x)

    with pytest.raises(ArgumentError, match=r"(?s)float\(\) of a SymbolicTensor.*at .*test_errors.py:\d+ in g"):
        g(X)


def test_wrong_number_of_arguments():
    @op.kernel
    def f(x, y):
        return x + y

    with pytest.raises(ArgumentError) as info:
        f(X)
    assert "kernel f" in str(info.value) and "y" in str(info.value)


def test_an_unexpected_keyword_is_named_with_the_parameters():
    @op.kernel
    def f(a, b):
        return a + b

    with pytest.raises(ArgumentError, match=r"unexpected keyword argument 'c'; its parameters are a, b"):
        f(X, c=X)
    with pytest.raises(ArgumentError, match=r"missing a required argument: 'b'; its parameters are a, b"):
        f(a=X)


def test_numpy_functions_on_traced_tensors_name_our_op_and_the_line():
    @op.kernel
    def f(x):
        return np.exp(x)

    @op.kernel
    def g(x):
        return np.sum(x, axis=0)

    for kernel, ours in ((f, "op.exp"), (g, "op.sum")):
        with pytest.raises(ArgumentError) as info:
            kernel(X)
        assert f"use {ours}" in str(info.value) and "test_errors.py" in str(info.value)


def test_numpy_operands_meet_tensors_through_the_operators():
    @op.kernel
    def f(x):
        return np.full(X.shape, 3.0, np.float32) - x * np.float32(2), np.zeros(X.shape, np.float32) < x

    diff, less = f(X)
    np.testing.assert_allclose(diff, 3.0 - X * 2, rtol=1e-6)
    np.testing.assert_array_equal(less, X > 0)


def test_every_error_is_a_tessera_error():
    for cls in (ArgumentError, AxisError, DTypeError, ResultError, ShapeError):
        assert issubclass(cls, TesseraError)


def test_floor_division_and_remainder_say_there_is_no_such_op_and_flatten_reshapes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for fn, says in ((lambda x: x // 2, "floor division"), (lambda x: 7 % x, "remainder")):
        with pytest.raises(ArgumentError, match=f"{says} .* of a SymbolicTensor f32\\[3,4\\] is not an op") as info:
            op.kernel(fn)(x)
        assert "op.cast(a / b, 'int32')" in info.value.hint
    np.testing.assert_array_equal(op.kernel(lambda x: x.flatten() * 2)(x), x.flatten() * 2)


def test_op_apply_with_missing_or_unknown_attributes_names_them():
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ArgumentError, match=r"(?s)gemm: .*missing a required argument: 'scale'.*"
                                            r"a: f32\[2,2\].*attributes are \['scale', 'activation'"):
        op.apply("gemm", (a, a))
    with pytest.raises(ArgumentError, match="exp: .*unexpected keyword argument 'foo'"):
        op.apply("exp", (a,), foo=1)
    with pytest.raises(ArgumentError, match="exp: cannot be applied to 2 operand"):
        op.apply("exp", (a, a))


def test_torch_spellings_get_ours_in_the_error():
    x = op.tensor((4, 8), "f32")
    with pytest.raises(AttributeError, match=r"'permute'; use x.transpose\(\*axes\)"):
        x.permute(1, 0)
    with pytest.raises(AttributeError, match=r"'exp'; use op.exp\(x\)"):
        x.exp()
    with pytest.raises(AxisError) as e:
        op.kernel(lambda a: op.max(a, a * 2))(np.ones((2, 2), np.float32))
    assert "op.maximum(x, y)" in e.value.hint


def test_a_big_endian_array_is_told_how_to_convert():
    with pytest.raises(ArgumentError) as e:
        op.kernel(lambda x: x * 2.0)(np.ones(4, ">f4"))
    assert "big-endian" in e.value.hint and "newbyteorder('=')" in e.value.hint


def test_an_fp8_encoding_gpus_do_not_compute_in_names_the_ones_they_do():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(ArgumentError) as e:
        op.kernel(lambda x: x * 2.0)(np.ones(4, np.float32).astype(ml_dtypes.float8_e4m3))
    assert "ml_dtypes.float8_e4m3fn" in e.value.hint


def test_two_index_arrays_say_to_take_along_one_axis_at_a_time():
    with pytest.raises(ShapeError, match="more than one index array") as e:
        op.kernel(lambda x: x[[0, 1], [0, 2]])(np.ones((3, 4), np.float32))
    assert "op.take" in e.value.hint


def test_a_kernel_called_on_python_numbers_only_says_they_are_constants():
    with pytest.raises(ResultError, match="every argument it was called with is a Python value") as e:
        op.kernel(lambda x, y: x + y)(1.5, 2.0)
    assert "np.asarray" in e.value.hint
    with pytest.raises(ResultError, match="Python value or numpy scalar") as e:
        op.kernel(lambda a: a * 2.0)(np.float32(3.0))
    assert "np.asarray(x) for a numpy scalar" in e.value.hint


def test_a_masked_array_is_refused_rather_than_computed_on_with_its_mask_ignored():
    masked = np.ma.masked_array(np.ones(3, np.float32), mask=[False, True, False])
    with pytest.raises(ArgumentError, match="argument 'a' is not a tensor.*masked array") as e:
        op.kernel(lambda a: a * 2.0)(masked)
    assert "filled" in e.value.hint and "op.where" in e.value.hint
    with pytest.raises(ArgumentError, match="exp: got a numpy masked array"):
        op.exp(masked)


def test_search_space_takes_one_number_for_a_list_and_refuses_a_bare_tile():
    k = op.kernel(lambda a, b: a @ b)
    assert k.schedule.search_space(pipeline_stages=3).kernel.restriction.pipeline_stages == (3,)
    for bad in ([64], 64):
        with pytest.raises(ArgumentError, match=r"tile_sizes must be a non-empty list of \(bm, bn\)"):
            k.schedule.search_space(tile_sizes=bad)


@pytest.mark.parametrize("build", [lambda x: x + 2**40, lambda x: x < 2**40, lambda x: op.full((2,), 2**40, "int32"),
                                   lambda x: op.pad(x, 1, constant_values=2**32 + 7),
                                   lambda x: op.full((2,), float("inf"), "int32"),
                                   lambda x: op.pad(x, 1, constant_values=float("nan"))],
                         ids=["add", "compare", "full", "pad", "inf", "nan"])
def test_an_integer_beyond_the_tensors_type_is_refused_naming_the_op_and_the_range(build):
    with pytest.raises(DTypeError, match=r"the value .* does not fit int32 \(-2147483648 to 2147483647\)") as info:
        op.kernel(build)(np.ones(2, np.int32))
    assert "hint: cast the tensor to a wider type first" in str(info.value)
    assert "test_errors.py" in str(info.value)


def test_an_int_tensor_compares_with_a_float_literal_in_float32_as_it_adds():
    got = op.kernel(lambda x: x == 16777217.0)(np.array([16777217, 16777216], np.int32))
    assert got.tolist() == [True, True]          # 16777217 is 16777216 in float32, on both sides


def test_a_list_of_numbers_used_as_a_tensor_is_told_to_become_an_array():
    doubled = op.kernel(lambda x: x * 2.0)
    with pytest.raises(ArgumentError, match="argument 'x' is a Python list of numbers") as e:
        doubled([[1.0, 2.0], [3.0, 4.0]])
    assert "numpy.asarray" in e.value.hint and isinstance(e.value.__cause__, TypeError)


_X = np.ones((1, 3, 10), np.float32)
_W = np.ones((4, 3, 3), np.float32)


@pytest.mark.parametrize("call, says", [
    (lambda: op.reshape(_X, None), "reshape: shape must be an int or ints, got None"),
    (lambda: op.conv1d(_X, _W, padding=1.7), "conv1d: padding must be an int, 'same', 'valid' or pairs, got 1.7"),
    (lambda: op.conv1d(_X, _W, padding=((1, 1.5),)), r"conv1d: padding must be ints, got \(1, 1.5\)"),
    (lambda: op.pad(_X, 1.5), r"pad: pad_width must be an int, a \(before, after\) pair or a pair per axis"),
    (lambda: op.split(_X, 2.5, axis=2), "split: indices_or_sections must be an int or ints, got 2.5"),
    (lambda: op.split(_X, [2.5], axis=2), r"split: indices_or_sections must be ints, got \(2.5,\)"),
    (lambda: op.tril(_X, k="a"), "tril: k must be an int, got 'a'"),
    (lambda: op.triu(_X, k=1.5), "triu: k must be an int, got 1.5"),
    (lambda: op.concatenate(5), "concatenate: xs must be a list of tensors, not a value of type int"),
    (lambda: op.stack(_X), "stack: xs must be a list of tensors, not a value of type ndarray"),
])
def test_an_attribute_of_the_wrong_kind_is_an_error_naming_the_op_and_the_attribute(call, says):
    with pytest.raises(TesseraError, match=says):
        call()


def test_the_attributes_checked_still_take_what_numpy_takes():
    assert op.conv1d(_X, _W, padding=((1, 2),)).shape == (1, 4, 11)
    assert [p.shape[2] for p in op.split(_X, np.array([3, 7]), axis=2)] == [3, 4, 3]
    assert op.tril(_X, k=np.int64(1)).shape == _X.shape
    assert op.pad(_X, np.array([[0, 0], [0, 0], [1, 2]])).shape == (1, 3, 13)
    assert op.concatenate(x for x in (_X, _X)).shape == (2, 3, 10)


@pytest.mark.parametrize("exponent", [-1, np.int64(-3)])
def test_an_integer_tensor_to_a_negative_constant_power_raises_as_numpy_does(exponent):
    ints = np.array([1, 2, 3, -1], np.int32)
    with pytest.raises(DTypeError) as info:
        op.kernel(lambda x: x ** exponent)(ints)
    msg = str(info.value)
    assert msg.startswith("pow:") and "i32[4]" in msg and "op.cast" in msg and "test_errors.py" in msg
    np.testing.assert_array_equal(op.kernel(lambda x: x ** 2)(ints), ints ** 2)
    np.testing.assert_allclose(op.kernel(lambda x: op.cast(x, "float32") ** exponent)(ints),
                               ints.astype(np.float32) ** float(exponent))


@pytest.mark.parametrize("call, named", [
    (lambda x: op.softmax(x, dim=-1), "softmax"), (lambda x: op.sum(x, dim=1, keepdim=True), "sum"),
    (lambda x: x.mean(dim=0), "mean"), (lambda x: op.logsumexp(x, dim=-1), "logsumexp"),
    (lambda x: op.concatenate([x, x], dim=0), "concatenate"),
])
def test_torchs_dim_and_keepdim_are_named_with_numpys_names(call, named):
    x = np.ones((2, 3), np.float32)
    for run in ((op.kernel(call),) if named == "mean" else (call, op.kernel(call))):    # x.mean: numpy's eagerly
        with pytest.raises(ArgumentError) as info:
            run(x)
        assert info.value.op == named and "axis= for torch's dim=" in info.value.detail
        assert "test_errors.py" in info.value.site and "axis=" in info.value.hint
    with pytest.raises(ArgumentError, match="keepdims= for torch's keepdim="):
        op.mean(x, axis=1, keepdim=True)


def test_torchs_two_axis_transpose_is_pointed_to_swapaxes():
    with pytest.raises(TesseraError, match=r"not a permutation of 3 axes(.|\n)*x.swapaxes\(-2, -1\)"):
        op.kernel(lambda x: x.transpose(-2, -1))(np.ones((2, 3, 4), np.float32))


def test_op_functions_still_pickle_as_themselves():
    import pickle
    for fn in (op.sum, op.softmax, op.concatenate, op.take_along_axis, op.matmul):
        assert pickle.loads(pickle.dumps(fn)) is fn
