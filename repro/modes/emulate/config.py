"""``mode=emulate``'s options: training on emulated WAN links of a case (needs root)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from baselines.placement import Placement
from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, group, option
from repro.config.shared import (
    Backend,
    CaseOptions,
    EmulateLayout,
    LayoutOptions,
    LocalRunOptions,
    ModelName,
    ModelOptions,
    Objective,
    SchedulerOptions,
    TrainedSystem,
    check_emulated_links,
    check_layout,
    check_local_ranks,
    fill_layout,
)
from system.emulation.verify import ON_FAIL

__all__ = ["EmulateConfig"]

OnFail = choice("OnFail", ON_FAIL, module=__name__)


@dataclass
@register_mode("emulate", rows=True)
class EmulateConfig(LocalRunOptions, LayoutOptions, ModelOptions, CaseOptions, RunConfig):
    """Train on emulated WAN links of a case (needs root), each run beside its prediction."""

    model: ModelName = option(ModelName.debug, "system/workload.py MODELS")
    devices: list[int] | None = option(
        None, "device ids of the case (null: first of each region)", ge=0
    )
    max_devices: int = option(8, "at most this many devices in the default pick", ge=1)
    bandwidth_scale: float = option(
        0.1, "every bandwidth x this (the delayer tops ~1.1 Gbit/s)", gt=0, le=100
    )
    delay_scale: float = option(1.0, "every one-way delay x this", gt=0, le=100)
    hidden_size: int = option(256, "the emulated model's hidden size", ge=1)
    seq_length: int = option(64, "the emulated model's sequence length", ge=1)
    vocab_size: int = option(128, "the emulated model's vocabulary", ge=1)
    layouts: list[EmulateLayout] = option(
        [EmulateLayout.scheduled, EmulateLayout.random], "system=ours: the layouts run"
    )
    random_layouts: int = option(2, "system=ours: random layouts per setting", ge=0)
    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: 300 trials, 60 s)"
    )
    baseline_placements: list[Placement] = option(
        [Placement.launch], "baselines: launch (the paper's protocol) and/or topology"
    )
    warmup_iters: int = option(2, "iterations left out of the medians", ge=0)
    verify_pairs: int = option(6, "sampled links checked (RTT, capacity) before the runs", ge=0)
    verify_tolerance: float = option(0.1, "relative error a verified link may have", gt=0)
    on_verify_fail: OnFail = option(OnFail["raise"], "what a link off target does")
    backend: Backend = option(
        Backend.auto, "netem, or the NFQUEUE delayer (auto: netem if present)"
    )

    def check(self) -> None:
        super().check()
        if not self.baseline_placements:
            raise ConfigError("baseline_placements=[]: name launch, topology or both")
        if self.scheduler.objective != Objective.comm:
            raise ConfigError(
                f"scheduler.objective={self.scheduler.objective}: mode=emulate schedules on "
                "the comm objective (its links and tasklet sizes)"
            )
        n_case = self.cluster().num_devices
        if self.devices is not None:
            bad = [d for d in self.devices if d >= n_case]
            if bad or len(set(self.devices)) != len(self.devices):
                raise ConfigError(
                    f"devices={self.devices}: ids must be distinct, in 0..{n_case - 1}"
                )
        n = len(self.devices) if self.devices else min(self.max_devices, n_case)
        check_emulated_links(
            self.cluster().subset(self.picked_devices(self.cluster())),
            self.bandwidth_scale,
            self.delay_scale,
        )
        if self.grid:
            check_local_ranks(self, self.tp * (self.pp or 1) * (self.dp or 1))
        else:
            self.limits.check_ranks(n, f"{n} emulated devices")
            if self.system == TrainedSystem.ours:
                check_layout(f"the {n} emulated devices", n, self.pp, self.dp)
            from system.workload import get_model

            model = dataclasses.replace(
                get_model(self.model, self.layers),
                hidden_size=self.hidden_size,
                seq_length=self.seq_length,
                vocab_size=self.vocab_size,
            )
            pp, dp = fill_layout(n, self.pp, self.dp)
            self.limits.check_memory(
                model,
                pp=pp,
                dp=dp,
                micro_batch_size=self.micro_batch_size,
                batch=self.batch or 4 * dp,
            )

    def picked_devices(self, cluster) -> list[int]:
        """The emulated devices of ``cluster``: ``devices``, else the first device of each region
        (region order), at most ``max_devices``."""
        if self.devices:
            return list(self.devices)
        first: dict = {}
        for d, r in enumerate(cluster.region_of):
            first.setdefault(r, d)
        return list(first.values())[: self.max_devices]
