"""SimResult: what one simulated training iteration of one system and layout costs."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SimResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """One simulated iteration.

    ``compute_time_s`` is the busiest device's compute seconds per iteration; ``comm_time_s`` is
    the rest of the iteration (communication not hidden behind compute, and pipeline bubbles).
    ``breakdown`` holds the phases (seconds) and model details, among them the modelling choices
    the simulator applied (``link_sharing``: the cluster's model; ``dp_collective``: the DP
    exchange that ran), which a result row records; ``config`` the layout knobs (tp, pp, dp,
    micro_batch_size, zero, ...).
    """

    system: str
    iter_time_s: float
    compute_time_s: float
    model_flops: float  # FLOPs per iteration (Workload.model_flops(recompute=True))
    memory_bytes: float  # peak per-device estimate
    config: dict = field(default_factory=dict)
    breakdown: dict = field(default_factory=dict)
    status: str = "ok"  # ok | oom

    def __post_init__(self) -> None:
        if self.status == "ok" and not self.iter_time_s > 0:
            raise ValueError(
                f"SimResult({self.system}): iter_time_s must be > 0, got {self.iter_time_s}"
            )

    @property
    def comm_time_s(self) -> float:
        return max(self.iter_time_s - self.compute_time_s, 0.0)

    @property
    def pflops(self) -> float:
        return self.model_flops / self.iter_time_s / 1e15 if self.status == "ok" else float("nan")

    def label(self) -> str:
        """Short configuration text, e.g. ``tp2/pp4/dp8 mbs1``."""
        c = self.config
        text = f"tp{c.get('tp', 1)}/pp{c.get('pp', 1)}/dp{c.get('dp', 1)}"
        text += f" mbs{c.get('micro_batch_size', 1)}"
        if c.get("zero"):
            text += f" zero{c['zero']}"
        if c.get("recompute", "full") != "full":
            text += f" rc-{c['recompute']}"
        if c.get("schedule", "gpipe") != "gpipe" and self.system.startswith("ours"):
            text += f" {c['schedule']}"  # ours runs GPipe unless told otherwise
        return text + features_label(c)


def features_label(config: dict) -> str:
    """The label's suffix for the frameworks' features a baseline configuration turns on:
    virtual stages, Megatron's distributed optimizer and overlaps, ZeRO's ``overlap_comm``
    (ZeRO-3 runs with it by default, so it is named there only when off).

    >>> features_label({"virtual_stages": 2, "distributed_optimizer": True,
    ...                 "overlap_grad_reduce": True, "overlap_param_gather": True})
    ' v2 distopt ovl-grad ovl-param'
    """
    c = config
    text = f" v{c['virtual_stages']}" if c.get("virtual_stages", 1) > 1 else ""
    text += " distopt" if c.get("distributed_optimizer") else ""
    text += " ovl-grad" if c.get("overlap_grad_reduce") else ""
    text += " ovl-param" if c.get("overlap_param_gather") else ""
    if c.get("zero") == 3:
        return text + ("" if c.get("overlap_comm", True) else " no-ovl-comm")
    return text + (" ovl-comm" if c.get("overlap_comm") else "")
