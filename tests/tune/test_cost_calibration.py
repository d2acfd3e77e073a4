"""The cost model against GEMM timings measured on an H200 (tests/data/tuning_logs): among the
warpgroup-MMA schedules fed by TMA, a smaller tile re-reads A and B from the L2 more often, and the
L2's feed into the SMs, not the tensor cores, sets its time. The model's order of those schedules
follows the measured one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera_rw.codegen.arch import arch_named
from tessera_rw.codegen.templates.registry import template_for
from tessera_rw.tune.space import ranked_space
from tessera_rw.tune.timing_log import ReplayMeasurer, TimingLog

LOGS = Path(__file__).resolve().parents[1] / "data" / "tuning_logs"


def _ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values))


@pytest.mark.parametrize("name", ["gemm-bf16-2048-H200", "gemm-bf16-4096-H200"])
def test_the_model_orders_tma_gemm_tiles_as_measured(name):
    log = TimingLog.load(LOGS / f"{name}.json")
    op = log.kernel_op()
    space = ranked_space(template_for(op), op, arch_named(log.arch))
    measured = ReplayMeasurer(log).measure(space.schedules)
    pairs = [(est, m.median_us) for s, est, m in zip(space.schedules, space.estimates, measured)
             if m.ok and s.describe().startswith("tma")]
    estimated, times = np.array(pairs).T
    rank_correlation = np.corrcoef(_ranks(estimated), _ranks(times))[0, 1]
    assert len(pairs) >= 20 and rank_correlation > 0.7


def test_a_large_gemm_keeps_a_large_tile():
    """8192³ bf16: a 64×64 tile streams 2.7x the L2 traffic of 128×256 (measured 1.9x slower at 4096³)."""
    from tessera_rw import autotune, op
    cfg = autotune(op.matmul, shapes=(8192, 8192, 8192), dtype="bf16", method="cost_model", cache=None, arch="H200")
    bm, bn, _ = cfg.main.schedule.bm, cfg.main.schedule.bn, cfg.main.schedule.bk
    assert bm * bn >= 128 * 128


def test_a_kernel_whose_l2_feed_outlasts_its_hbm_traffic_is_said_to_be_bound_by_the_feed():
    """A big GEMM's tiles re-read their operands from L2 many times over: when that feed, not the
    HBM traffic, is the longer memory term, the report must not blame HBM."""
    import dataclasses
    from tessera_rw.algebra.dtypes import DType
    from tessera_rw.algebra.node import TensorType
    from tessera_rw.codegen.arch import arch_named
    from tessera_rw.codegen.kernel_op import KernelOp
    from tessera_rw.tune.cost import kernel_cost
    t = TensorType((4096, 4096), DType.bfloat16)
    cost = kernel_cost(KernelOp.of("matmul", (t, t), t, accum_dtype=None), arch_named("h100"))
    feed = dataclasses.replace(cost, compute_us=5.0, memory_us=9.0, l2_feed_us=9.0, launch_us=2.0)
    hbm = dataclasses.replace(feed, l2_feed_us=3.0)
    assert (feed.bound, hbm.bound) == ("L2 feed", "memory")
    assert feed.why().startswith("bound by the L2 feed: 9 µs") and hbm.why().startswith("memory-bound")
