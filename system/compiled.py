"""Numeric kernels compiled by numba at their first call.

The scheduler's, the replay's and the link-sharing model's inner loops (Held–Karp, bottleneck
matching values, the coarse-edge lower bounds, the pipeline event loop, max-min filling) are
plain loops over numpy arrays of floats and ints. :func:`kernel` compiles such a function with
numba the first time it is called (numba is imported only then: a process that never calls one,
such as a command that refuses its input, does not pay for it) and keeps the machine code on
disk beside its module, so later processes load it instead of compiling again (a few seconds on
a fresh checkout). No fast-math: the compiled loops do the same IEEE operations as the Python
source reads, so their results do not depend on whether they ran compiled. A kernel calls no
other kernel.

    @kernel
    def total(x):
        s = 0.0
        for v in x:
            s += v
        return s
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["kernel"]


def kernel(fn: Callable) -> Callable:
    """``fn`` compiled with numba (``nopython``, cached on disk) at its first call."""
    compiled: Callable | None = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            from numba import njit

            compiled = njit(cache=True)(fn)
        return compiled(*args)

    return call
