"""``mode=simulate``'s options: the paper's Fig. 3 grid in the performance simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines.placement import Placement
from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, choice, group, option
from repro.config.shared import (
    CaseOptions,
    LayoutOptions,
    LinkSharing,
    ModelName,
    ModelOptions,
    SchedulerOptions,
    check_layout,
    fill_layout,
    load_case,
)
from system.cases import PAPER_CASES, canonical_case
from system.config_search import CONFIG_SETS
from system.results import SIMULATED_SYSTEMS
from system.simulator.baseline_training import DP_REQUESTS
from system.simulator.sharing import DEFAULT_LINK_SHARING
from system.simulator.transfers import TRANSPORTS
from system.workload import PAPER_BATCH_SIZES, PAPER_LAYERS

__all__ = ["SimulateConfig", "SimulatedSystem"]

SimulatedSystem = choice("SimulatedSystem", ("all", *SIMULATED_SYSTEMS), module=__name__)
Transport = choice("Transport", TRANSPORTS, module=__name__)
DpCollective = choice("DpCollective", DP_REQUESTS, module=__name__)
Tables = choice("Tables", ("compact", "wide"), module=__name__)
OursConfigs = choice("OursConfigs", CONFIG_SETS, module=__name__)


@dataclass
@register_mode(
    "simulate",
    rows=True,
    prefetch="repro.modes.simulate.run:prefetch",
    warm="repro.modes.simulate.run:warm",
)
class SimulateConfig(LayoutOptions, ModelOptions, CaseOptions, RunConfig):
    """The paper's Fig. 3 experiment in the performance simulator: every system, no GPU."""

    case: Any = option("5", "a case, a list of cases, or all (1..5); aliases as their number")
    system: SimulatedSystem = option(SimulatedSystem.all, "all, or one system")
    repeats: int = option(1, "repeats per setting (ours_random: at least 3 random layouts)", ge=1)
    scheduler: SchedulerOptions = group(
        SchedulerOptions, "scheduler.* (null budget: 4 trials, population 4, 1 s)"
    )
    baseline_placements: list[Placement] = option(
        [Placement.launch, Placement.topology],
        "the baselines' rank placements: launch (the paper's protocol), topology (fair)",
    )
    compute_efficiency: float | None = option(
        None, "fraction of V100 peak (null: the hardware model's 0.30)", gt=0, le=1
    )
    link_sharing: LinkSharing = option(
        LinkSharing(DEFAULT_LINK_SHARING),
        "how concurrent flows share links: pair | nic | region | flow | tc_class (the paper's "
        "tc emulation, the default; system/simulator/sharing.py)",
    )
    baseline_transport: Transport = option(Transport.nccl, "the baselines' transport model")
    dp_collective: DpCollective = option(
        DpCollective.auto,
        "the baselines' DP collective: auto (NCCL's own pick, its tuner), ring | tree | "
        "two_level (Megatron) forced, fastest (the fastest under the link model: what a user "
        "forces with NCCL_ALGO after measuring)",
    )
    baseline_features: bool = option(
        True,
        "the baselines' framework features in their grids: Megatron's interleaved 1F1B and "
        "distributed optimizer with overlapped gradient reduce-scatter / parameter all-gather, "
        "DeepSpeed ZeRO-1's overlap_comm (false: the grids without them)",
    )
    ours_configs: OursConfigs = option(
        OursConfigs.runnable,
        "ours' configuration search: runnable (only what system/runtime runs: GPipe, full or no "
        "recomputation) or all (1F1B and selective recomputation too: the design space)",
    )
    tables: Tables = option(Tables.compact, "console: one 100-column table, or the wide ones")
    plan: str | None = option(
        None, "a plan.json of mode=plan: simulate that plan on its fleet (case) instead"
    )

    def _canonical(self, case) -> list[str]:
        items = list(case) if isinstance(case, (list, tuple)) else [case]
        if not items or any(c is None or isinstance(c, (bool, float, dict, list)) for c in items):
            raise ConfigError(f"case={case!r}: expected 1..5, all, debug, an alias or a file")
        if [str(c).lower() for c in items] == ["all"]:
            return list(PAPER_CASES)
        return list(dict.fromkeys(canonical_case(c) for c in items))  # each case once

    def cases(self) -> list[str]:
        return list(self.case)

    def check(self) -> None:
        super().check()
        if self.plan is not None:
            from system.planner.record import check_plan, read_plan

            if len(self.cases()) != 1:
                raise ConfigError(f"plan={self.plan!r}: give the plan's one fleet as case")
            try:
                check_plan(
                    read_plan(self.plan), self.cases()[0], str(self.model), self.layers, self.batch
                )
            except ValueError as e:
                raise ConfigError(f"plan={self.plan!r}: {e}") from None
            return
        if not self.baseline_placements:
            raise ConfigError("baseline_placements=[]: name launch, topology or both")
        self.baseline_placements = list(dict.fromkeys(self.baseline_placements))
        self.limits.check_repeats(self.repeats)
        for case in self.cases():
            n = load_case(case, self.case_variant, self.limits.max_devices).num_devices
            check_layout(f"case {case}", n, self.pp, self.dp)
            pp, dp = fill_layout(n, self.pp, self.dp)
            for layers, batch in self.grid():
                self._check_setting(case, layers, batch, pp, dp)

    def settings(self) -> list[tuple[str, int, int]]:
        """Every (case, layers, batch) this run simulates."""
        return [(c, layers, batch) for c in self.cases() for layers, batch in self.grid()]

    def grid(self) -> list[tuple[int, int]]:
        """(layers, batch) pairs: the given ones, else the paper's for gpt3_xl."""
        paper = self.model == ModelName.gpt3_xl
        layers = (
            [self.layers] if self.layers else list(PAPER_LAYERS if paper else [self.model_layers()])
        )
        batches = [self.batch] if self.batch else list(PAPER_BATCH_SIZES if paper else [16])
        return [(layer, b) for layer in layers for b in batches]

    def _check_setting(self, case: str, layers: int, batch: int, pp: int, dp: int) -> None:
        from system.workload import Workload, get_model

        self.limits.check_micro_batches(batch, self.micro_batch_size)
        try:
            Workload(
                model=get_model(self.model, layers),
                global_batch_size=batch,
                micro_batch_size=self.micro_batch_size,
            ).check_layout(pp, dp)
        except ValueError as e:
            raise ConfigError(f"case {case}, layers={layers}, batch={batch}: {e}") from None
