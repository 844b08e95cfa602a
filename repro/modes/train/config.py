"""``mode=train``'s options: training on this machine's processes, ours or a real baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.config.base import RunConfig, register_mode
from repro.config.options import ConfigError, Options, choice, group, option
from repro.config.shared import (
    LayoutOptions,
    LocalRunOptions,
    ModelName,
    ModelOptions,
    TrainedSystem,
    check_local_ranks,
)
from system.runtime.spec import DEVICES, DP_MODES, LAYOUTS, MAX_LR

__all__ = ["TrainConfig", "RuntimeOptions"]

DpMode = choice("DpMode", DP_MODES, module=__name__)
RankLayout = choice("RankLayout", LAYOUTS, module=__name__)
Device = choice("Device", DEVICES, module=__name__)


@dataclass
class RuntimeOptions(Options):
    """Our runtime's knobs (system/runtime)."""

    KEY = "runtime"
    layout: RankLayout = option(RankLayout.identity, "rank map when no assignment file is given")
    assignment: str | None = option(None, "a schedule's JSON {stages: [[...], ...]}")
    dp_mode: DpMode = option(DpMode.sharded_ps, "gradient exchange")
    checkpointing: bool = option(False, "recompute block activations in backward")
    lr: float = option(0.003, "learning rate (ours and the baselines)", gt=0, le=MAX_LR)
    device: Device = option(Device.cpu, "cpu (gloo) | cuda (NCCL)")
    amp: bool = option(False, "fp16 autocast + loss scaling (device=cuda)")

    def check(self) -> None:
        super().check()
        from pathlib import Path

        if self.assignment is not None and not Path(self.assignment).is_file():
            raise ConfigError(f"runtime.assignment={self.assignment!r}: no such file")


@dataclass
@register_mode("train", rows=True)
class TrainConfig(LocalRunOptions, LayoutOptions, ModelOptions, RunConfig):
    """Train on this machine's processes: our runtime, or real Megatron / DeepSpeed."""

    model: ModelName = option(ModelName.debug, "system/workload.py MODELS")
    runtime: RuntimeOptions = group(RuntimeOptions, "runtime.*")
    metrics_out: str | None = option(None, "system=ours: a JSON file of per-iteration metrics")
    trace: str | None = option(None, "system=ours: a Chrome trace file of every rank")
    log_dir: str | None = option(None, "system=ours: keep the run's spec.json and rank logs here")
    grid_devices: int | None = option(None, "grid: ranks to search over (null: tp*pp*dp)", ge=1)

    def check(self) -> None:
        super().check()
        if self.runtime.assignment is not None:
            from system.assignment import Assignment

            try:
                a = Assignment.load(self.runtime.assignment)
            except (ValueError, KeyError, OSError) as e:
                raise ConfigError(f"runtime.assignment={self.runtime.assignment!r}: {e}") from None
            self.limits.check_ranks(a.pp * a.dp, f"runtime.assignment's {a.pp}x{a.dp} ranks")
            return
        if self.grid:
            ranks = self.grid_devices or self.tp * (self.pp or 1) * (self.dp or 1)
            self.limits.check_ranks(ranks, f"grid over grid_devices={ranks}")
        else:
            check_local_ranks(self, self.tp * (self.pp or 1) * (self.dp or 1))
        if self.system == TrainedSystem.ours:
            pp, dp, batch = self.pp or 1, self.dp or 1, self.batch or 8
            if batch % (dp * self.micro_batch_size):
                raise ConfigError(
                    f"batch={batch} is not divisible by dp={dp} x "
                    f"micro_batch_size={self.micro_batch_size}"
                )
            if self.model_layers() % pp:
                raise ConfigError(
                    f"pp={pp} does not divide the model's {self.model_layers()} layers"
                )
        for key in ("metrics_out", "trace"):
            path = getattr(self, key)
            if path is not None and (not path.strip() or Path(path).is_dir()):
                raise ConfigError(f"{key}={path!r}: names a folder, give a file")
        if (
            self.log_dir is not None
            and Path(self.log_dir).exists()
            and not Path(self.log_dir).is_dir()
        ):
            raise ConfigError(f"log_dir={self.log_dir!r}: is a file, not a folder")
        if not self.grid:
            from system.workload import get_model

            self.limits.check_memory(
                get_model(self.model, self.layers),
                pp=self.pp or 1,
                dp=self.tp * (self.dp or 1),
                micro_batch_size=self.micro_batch_size,
                batch=self.batch or 8,
            )
