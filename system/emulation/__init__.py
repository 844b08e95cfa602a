"""WAN emulation (paper §4.1): network namespaces + HTB + per-pair delay, and tc scripts for
real hosts."""

from system.emulation.plan import EmulationPlan, make_plan

__all__ = ["EmulationPlan", "make_plan"]
