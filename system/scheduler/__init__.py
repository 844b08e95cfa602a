"""The scheduler (paper §3.4): ``from system.scheduler import schedule, ScheduleResult, SCHEDULERS``.

The names are loaded lazily (PEP 562) so that :mod:`system.scheduler.assignment` can be imported
by the cost model without pulling in the search, which itself imports the cost model.
"""

from __future__ import annotations

__all__ = ["schedule", "ScheduleResult", "SCHEDULERS"]


def __getattr__(name: str):
    if name in __all__:
        from system.scheduler import api

        return getattr(api, name)
    raise AttributeError(f"module 'system.scheduler' has no attribute {name!r}")
