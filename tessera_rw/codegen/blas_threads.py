"""One BLAS thread for loops of small products: the numpy executor's blockwise attention multiplies
128-row tiles, where OpenBLAS's threads cost more than they give and, spinning, starve the rest of
the machine (the example's bf16 attention, 4 x 16 x 2048 x 64, took minutes on two busy cores and
takes seconds on one thread). Large products elsewhere keep every thread.

>>> import numpy as np
>>> with one_blas_thread():
...     float((np.ones((4, 4)) @ np.ones(4))[0])
4.0
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_blas_thread() -> threadpool_limits:
    """A context in which BLAS calls (numpy's matmul) run on one thread."""
    return threadpool_limits(limits=1, user_api="blas")
