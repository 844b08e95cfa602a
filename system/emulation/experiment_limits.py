"""The numbers an emulated experiment may hold (a registration is a file a user can edit): its
device count, link scales, egress cap and byte, repeat and warm-up counts, each checked with one
ValueError naming the key before any emulation is built."""

from __future__ import annotations

import math

__all__ = [
    "MAX_DEVICES",
    "MAX_NBYTES",
    "is_finite_number",
    "are_device_ids",
    "check_link_and_run_numbers",
]

MAX_DEVICES = 16  # emulated devices (each a namespace and a rank on this machine)
MAX_NBYTES = 2**30  # gradient bytes per device (each rank holds a few copies)


def is_finite_number(v) -> bool:
    """``v`` is an int or float (not a bool) and finite."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def are_device_ids(devices, num_devices: int) -> bool:
    """``devices`` are 2..:data:`MAX_DEVICES` distinct integer ids of a case's ``num_devices``."""
    return (
        2 <= len(devices) <= MAX_DEVICES
        and all(isinstance(d, int) and not isinstance(d, bool) for d in devices)
        and len(set(devices)) == len(devices)
        and all(0 <= d < num_devices for d in devices)
    )


def check_link_and_run_numbers(experiment, *, min_nbytes: int) -> None:
    """ValueError naming the key unless an emulated experiment's link scales and egress cap are
    finite numbers in (0, 100] and its ``nbytes`` (``min_nbytes``..:data:`MAX_NBYTES`),
    ``repeats`` (1..100) and ``warmup`` (0..100) are integers in range."""
    for key in ("bandwidth_scale", "delay_scale", "egress_cap_gbps"):
        v = getattr(experiment, key)
        if not is_finite_number(v) or not 0 < v <= 100:
            raise ValueError(f"{key}={v!r}: a finite number in (0, 100]")
    for key, low, high in (
        ("nbytes", min_nbytes, MAX_NBYTES),
        ("repeats", 1, 100),
        ("warmup", 0, 100),
    ):
        v = getattr(experiment, key)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError(f"{key}={v!r}: an integer in {low}..{high}")
