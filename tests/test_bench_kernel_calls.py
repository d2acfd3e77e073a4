"""bench's paired call timing: each pair's two calls are timed back to back, in alternating order,
and the overhead is the median of the pairs' differences, so a burst of load hitting some pairs
whole drops out."""

from bench import kernel_calls


def test_paired_timing_takes_the_median_difference_through_bursts_of_load(monkeypatch):
    now = [0]
    calls = [0]

    def advance(ns):
        calls[0] += 1
        burst = 5000 if 200 <= calls[0] < 240 else 0        # a stretch of slow calls, both kinds
        now[0] += ns + burst
    monkeypatch.setattr(kernel_calls.time, "perf_counter_ns", lambda: now[0])
    call_us, base_us, overhead_us = kernel_calls.paired_calls_us(lambda: advance(30_000), lambda: advance(20_000),
                                                                 pairs=400)
    assert (call_us, base_us, overhead_us) == (30.0, 20.0, 10.0)
