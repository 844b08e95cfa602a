"""``mode=replan``'s options: a spot pre-emption trace replayed on a case."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, option
from repro.config.shared import CaseOptions, ModelOptions
from system.workload import PAPER_BATCH_SIZES

__all__ = ["ReplanConfig"]


@dataclass
@register_mode("replan")
class ReplanConfig(ModelOptions, CaseOptions, RunConfig):
    """Replay a spot pre-emption trace on a case, re-planning warm vs from scratch."""

    events: int = option(8, "trace events (devices leave or come back)", ge=1)
    step_devices: int = option(16, "devices per event (a multiple of dp)", ge=1)
    interval_s: float = option(
        3600.0, "simulated seconds between events (at most a year)", gt=0, le=365 * 86400.0
    )
    time_limit_s: float = option(1.0, "warm re-planning budget per event", gt=0, le=3600.0)
    dp: int = option(8, "replicas, kept fixed (pp = present devices / dp)", ge=1)

    def check(self) -> None:
        super().check()
        if self.step_devices % self.dp:
            raise ConfigError(
                f"step_devices={self.step_devices} must be a multiple of dp={self.dp}"
            )
        self._check_trace()

    def _check_trace(self) -> None:
        """Every device count the trace reaches gives a layout the model fits (checked on the
        seeded trace itself, before any planning)."""
        from system.scheduler.replan import spot_trace as trace
        from system.simulator import V100
        from system.simulator.ours import accumulation_rounds
        from system.workload import Workload, get_model

        n = self.cluster().num_devices
        if n % self.dp:
            raise ConfigError(f"dp={self.dp} does not divide case {self.case}'s {n} devices")
        if self.step_devices > n // 2:
            raise ConfigError(
                f"step_devices={self.step_devices}: more than half of case {self.case}'s {n} "
                "devices, so no event could remove or return any (the trace keeps at least half)"
            )
        work = Workload(
            model=get_model(self.model, self.layers),
            global_batch_size=self.global_batch(),
            micro_batch_size=self.micro_batch_size,
        )
        for count in sorted({len(p) for p in trace(n, self.events, self.step_devices, self.seed)}):
            pp = count // self.dp
            where = f"step_devices={self.step_devices}: the trace reaches {count} devices"
            try:
                work.check_layout(pp, self.dp)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
            if accumulation_rounds(work, pp, self.dp, V100) == 0:
                raise ConfigError(
                    f"{where}: with pp={pp} not one micro-batch of {self.model} "
                    f"({work.model.num_layers} layers) fits a {V100.name}'s memory"
                )

    def global_batch(self) -> int:
        return self.batch or PAPER_BATCH_SIZES[0]
