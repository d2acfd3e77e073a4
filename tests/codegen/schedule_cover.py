"""Which default schedules the cross-product tests run (every sample of a template at every default
schedule is a few thousand compiles): every sample at its first schedule, the one an untuned call
runs, and at KEEP - 1 more, picked so that between them the samples of one template run each
distinct schedule it offers at least once. KEEP is 1: a second schedule for every sample would
only run, on one more sample, a schedule some sample of the template already runs.
Set TESSERA_EXHAUSTIVE=1 to run every schedule of every sample.

>>> covering({"a": ["s1", "s2", "s3"], "b": ["s1", "s2", "s3"], "c": ["s1", "s4"]}, keep=2, describe=str)
{'a': ['s1', 's2'], 'b': ['s1', 's3'], 'c': ['s1', 's4']}
>>> covering({"a": ["s1", "s2", "s3", "s4"], "b": ["s1", "s2", "s3", "s4"]}, keep=2, describe=str)
{'a': ['s1', 's2', 's4'], 'b': ['s1', 's3']}
"""

from __future__ import annotations

import os
from typing import Callable, Hashable, Sequence, TypeVar

EXHAUSTIVE = os.environ.get("TESSERA_EXHAUSTIVE", "") not in ("", "0")
KEEP = 1

S = TypeVar("S")
K = TypeVar("K", bound=Hashable)


def covering(schedules: dict[K, Sequence[S]], keep: int = KEEP,
             describe: Callable[[S], str] = lambda s: s.describe()) -> dict[K, list[S]]:
    """For each sample (key) of one template, the schedules to run: its first, then those no earlier
    sample ran, up to `keep` in all; a schedule still unrun after the last sample is added to the
    first sample that offers it. Schedules are told apart by `describe`."""
    if EXHAUSTIVE:
        return {key: list(offered) for key, offered in schedules.items()}
    ran: set[str] = set()
    picked: dict[K, list[S]] = {}
    for key, offered in schedules.items():
        first, rest = list(offered[:1]), sorted(offered[1:], key=lambda s: describe(s) in ran)
        picked[key] = first + rest[:max(0, keep - 1)]
        ran.update(map(describe, picked[key]))
    for key, offered in schedules.items():
        for s in offered:
            if describe(s) not in ran:
                picked[key].append(s)
                ran.add(describe(s))
    return {key: [s for s in offered if s in picked[key]] for key, offered in schedules.items()}
