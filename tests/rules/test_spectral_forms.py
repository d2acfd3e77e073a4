"""Convolutions keep their direct and FFT forms side by side in one e-class, and both compute the same."""

import numpy as np
import pytest

from tessera_rw import op
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.graph import Graph
from tessera_rw.rules.choice import smallest_choice
from tessera_rw.rules.library import BUILTIN_RULESETS
from tessera_rw.rules.saturate import rewrite

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("length, kernel, padding, groups", [
    (64, 3, "same", 1),          # a short kernel
    (64, 64, (63, 0), 1),        # a causal long convolution: the kernel as long as the sequence
    (48, 48, "same", 4),         # depthwise, Hyena-style
    (32, 5, 0, 2),               # grouped, no padding
])
def test_direct_and_fft_forms_share_an_eclass(length, kernel, padding, groups):
    channels = 4
    x = RNG.standard_normal((2, channels, length)).astype(np.float32)
    w = RNG.standard_normal((channels, channels // groups, kernel)).astype(np.float32)
    graph = op.kernel(lambda x, w: op.conv1d(x, w, padding=padding, groups=groups)).trace(x, w)
    result = rewrite(graph, BUILTIN_RULESETS)
    view = result.view
    root = result.output_classes()[0]
    ops = view.ops_in(root)
    assert {"conv1d", "slice"} <= ops, ops
    base = smallest_choice(view)
    want = evaluate(graph, {"x": x, "w": w})[0]
    for enode in view.classes[root]:
        form = Graph("conv", graph.inputs, (view.decode(base | {root: enode}, root),)).verify()
        got = evaluate(form, {"x": x, "w": w})[0]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_strided_or_dilated_convolutions_stay_direct():
    x = RNG.standard_normal((1, 2, 32)).astype(np.float32)
    w = RNG.standard_normal((2, 2, 3)).astype(np.float32)
    for kw in ({"stride": 2}, {"dilation": 2}):
        graph = op.kernel(lambda x, w: op.conv1d(x, w, **kw)).trace(x, w)
        result = rewrite(graph, BUILTIN_RULESETS)
        assert result.view.ops_in(result.output_classes()[0]) == {"conv1d"}


def test_large_2d_kernel_has_an_fft_form():
    x = RNG.standard_normal((1, 2, 24, 24)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 11, 11)).astype(np.float32)
    graph = op.kernel(lambda x, w: op.conv2d(x, w, padding="same")).trace(x, w)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, root = result.view, result.output_classes()[0]
    fft = [n for n in view.classes[root] if n.op == "slice"]
    assert fft
    form = Graph("c", graph.inputs, (view.decode(smallest_choice(view) | {root: fft[0]}, root),)).verify()
    assert {"rfft", "fft", "ifft", "irfft", "spectral_contract"} <= set(form.op_counts())
    want = evaluate(graph, {"x": x, "w": w})[0]
    np.testing.assert_allclose(evaluate(form, {"x": x, "w": w})[0], want, atol=1e-4 * np.abs(want).max())


def test_a_real_scalar_times_a_spectrum_enters_the_egraph(monkeypatch):
    """2.0 * rfft(x) makes a complex-typed constant with a real value; a truly complex one is refused clearly."""
    import numpy as np
    import pytest
    from tessera_rw import op
    from tessera_rw.algebra.errors import TesseraError
    monkeypatch.setenv("TESSERA_DEVICE", "cpu")
    x = np.arange(8.0)
    assert np.allclose(op.kernel(lambda x: op.irfft(op.rfft(x) * 2.0, n=8))(x), 2 * x)
    with pytest.raises(TesseraError, match="complex constant"):
        op.kernel(lambda x: op.irfft(op.rfft(x) * (1 + 2j), n=8))(x)


def test_transforms_run_at_fast_lengths():
    """The egglog expression of a fast length agrees with its Python twin and is 2^k times an odd
    factor of the table; a causal conv padded to 8191 samples (a prime) transforms at 8192."""
    from egglog import bindings

    from tessera_rw.rules.tables import FFT_ODD_FACTORS, fast_fft_length, fast_fft_length_of

    egraph = bindings.EGraph()
    for n in list(range(1, 300)) + [8191, 12287, 16383, 100_003, 1 << 20]:
        (got,) = egraph.run_program(*egraph.parse_program(f"(extract {fast_fft_length(str(n))})"))
        value = int(got.termdag.to_string(got.term))
        assert value == fast_fft_length_of(n) and n <= value <= max(1.12 * n, n + 1), n
        odd = value // (value & -value)
        assert odd in FFT_ODD_FACTORS, (n, value)

    x = RNG.standard_normal((1, 2, 4096)).astype(np.float32)
    w = RNG.standard_normal((2, 1, 4096)).astype(np.float32)
    graph = op.kernel(lambda x, w: op.conv1d(x, w, padding=(4095, 0), groups=2)).trace(x, w)
    result = rewrite(graph, BUILTIN_RULESETS)
    view, root = result.view, result.output_classes()[0]
    fft = next(n for n in view.classes[root] if n.op == "slice")
    form = Graph("c", graph.inputs, (view.decode(smallest_choice(view) | {root: fft}, root),)).verify()
    assert {n.attr_map["n"] for n in form.nodes if n.op in ("rfft", "irfft")} == {8192}
    want = evaluate(graph, {"x": x, "w": w})[0]
    np.testing.assert_allclose(evaluate(form, {"x": x, "w": w})[0], want, atol=1e-4 * np.abs(want).max())
