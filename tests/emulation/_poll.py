"""Polling for the emulation tests: wait, bounded in time, until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(pred: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    """True as soon as ``pred()`` holds, False once ``timeout_s`` has passed without it."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(poll_s)
    return False
