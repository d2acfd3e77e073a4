"""Extraction is exact: matrix chains against the textbook dynamic program."""

import random

import pytest

from tessera_rw import op
from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.node import TensorType
from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.kernel_op import KernelOp
from tessera_rw.rules.library import ALGEBRA
from tessera_rw.rules.saturate import Limits, StopReason, rewrite
from tessera_rw.tune.cost import kernel_cost
from tessera_rw.tune.extract import FusionDepth, Objective, extract_candidates

H100 = arch_named("H100-SXM")


def chain_graph(dims: list[int], dtype: str = "float32"):
    names = [f"m{i}" for i in range(len(dims) - 1)]
    namespace: dict = {}
    exec(f"def chain({', '.join(names)}):\n    return {' @ '.join(names)}", namespace)
    inputs = {n: op.tensor((dims[i], dims[i + 1]), dtype) for i, n in enumerate(names)}
    return op.kernel(namespace["chain"]).trace(**inputs)


def chain_optimum(dims: list[int], product_cost) -> float:
    """The textbook O(n³) dynamic program over where the last product splits the chain."""
    n = len(dims) - 1
    best = [[0.0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            best[i][j] = min(best[i][k] + best[k + 1][j] + product_cost(dims[i], dims[k + 1], dims[j + 1])
                             for k in range(i, j))
    return best[0][n - 1]


def random_chains(seed: int, count: int, sizes: range):
    rng = random.Random(seed)
    return [[rng.choice(sizes) for _ in range(rng.randint(3, 8) + 1)] for _ in range(count)]


def extract(dims, objective, dtype="float32"):
    result = rewrite(chain_graph(dims, dtype), [ALGEBRA], Limits(iterations=40, enodes=50_000))
    assert result.report.stop_reason is StopReason.saturated
    return extract_candidates(result, H100, objective=objective)[0]


@pytest.mark.parametrize("seed", range(4))
def test_chosen_chain_has_the_textbook_minimum_flops(seed):
    for dims in random_chains(seed, 15, range(1, 300)):
        chosen = extract(dims, Objective.FLOPS)
        assert chosen.flops == chain_optimum(dims, lambda m, k, n: 2 * m * k * n), dims
        assert [k.kind for k in chosen.kernels] == ["gemm"] * (len(dims) - 2)


@pytest.mark.parametrize("seed", range(2))
def test_chosen_chain_is_the_time_optimum_of_the_cost_model(seed):
    """Under the time objective extraction finds the dynamic program's optimum of the same model; on
    large compute-bound chains that is the FLOP optimum up to wave quantization (a partial last wave
    of blocks may make a product with a few % more FLOPs faster)."""
    f32 = DType.float32

    def product_us(m, k, n):
        a, b, c = TensorType((m, k), f32), TensorType((k, n), f32), TensorType((m, n), f32)
        return kernel_cost(KernelOp.of("matmul", (a, b), c, accum_dtype=None), H100).est_us

    exact = 0
    chains = random_chains(100 + seed, 12, range(1024, 4097, 128))
    for dims in chains:
        chosen = extract(dims, Objective.TIME)
        assert chosen.est_us == pytest.approx(chain_optimum(dims, product_us), rel=1e-9), dims
        textbook = chain_optimum(dims, lambda m, k, n: 2 * m * k * n)
        assert chosen.flops <= 1.05 * textbook, dims
        exact += chosen.flops == textbook
    assert exact >= len(chains) - 2


def test_chain_candidates_are_unfused_gemms_in_fp32_and_bf16():
    for dtype in ("float32", "bfloat16"):
        chosen = extract([512, 1024, 64, 2048], Objective.TIME, dtype)
        assert chosen.fusion_depth is FusionDepth.UNFUSED
        assert chosen.flops == 2 * 512 * 1024 * 64 + 2 * 512 * 64 * 2048   # (AB)C: the small middle dim first
