"""The scheduler (paper §3.4).

from system.scheduler import schedule, ScheduleResult, SCHEDULERS
"""

from __future__ import annotations

from system.scheduler.api import SCHEDULERS, ScheduleResult, schedule

__all__ = ["schedule", "ScheduleResult", "SCHEDULERS"]
