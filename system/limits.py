"""What one machine can take: sizes checked before any work, with one line and an override.

A run whose input is too big for this machine should say so at once, not swap, hang or die hours
later. Each check compares one number with a limit named by a config key and, when it is over,
raises :class:`LimitError` with one line naming the value, the key, its limit and how to go past
it (``set limits.max_devices=10000 to run anyway``); the limits are keys of the ``limits.*``
config block, with these defaults:

- devices of a cluster (:data:`DEFAULT_MAX_DEVICES`): every link matrix, the scheduler and the
  simulator grow with the square of the device count (10,000 devices are two 800 MB matrices
  before any search);
- repeats of a setting (:data:`DEFAULT_MAX_REPEATS`): every repeat is one stored row per system
  and configuration;
- host memory of a CPU training run (:func:`train_memory_bytes`, default limit
  :data:`DEFAULT_MEMORY_FRACTION` of this machine's memory): every rank of ``mode=train`` runs on
  this machine in fp32 with Adam;
- the budget of one layout search (:data:`DEFAULT_MAX_SEARCH_S` seconds of wall time,
  :data:`DEFAULT_MAX_TRIALS` trials, population or patience) and the random layouts drawn for one
  setting (:data:`DEFAULT_MAX_RANDOM_LAYOUTS`): a search stops at its trials, its patience or its
  time limit, whichever comes first, so a budget of 10^12 trials and 10^300 seconds never ends,
  and every random layout is held and simulated.
"""

from __future__ import annotations

import math
import os

from system.simulator.memory import training_memory
from system.workload import GPTConfig

__all__ = [
    "LimitError",
    "over_limit",
    "DEFAULT_MAX_DEVICES",
    "DEFAULT_MAX_REPEATS",
    "DEFAULT_MEMORY_FRACTION",
    "DEFAULT_MAX_SEARCH_S",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_MAX_RANDOM_LAYOUTS",
    "RANK_PROCESS_BYTES",
    "check_devices",
    "check_repeats",
    "machine_memory_bytes",
    "train_memory_bytes",
    "check_train_memory",
    "cpu_cores",
]

# 16x the paper's 64 GPUs. Measured (mode=simulate, debug model, 32 layers, pp=8, 4 regions, on
# a shared 2-core machine): 512 devices 14 s and 0.37 GB, 1024 devices 110 s and 1.0 GB.
DEFAULT_MAX_DEVICES = 1024
DEFAULT_MAX_REPEATS = 1000
DEFAULT_MEMORY_FRACTION = 0.8  # of this machine's memory, for the ranks of one training run
# One search: an hour of wall time; 20x the GA's default 4,900 trials
# (system.scheduler.api.DEFAULT_TRIALS); 2x the scheduler ablation's 5,000 random layouts per seed.
DEFAULT_MAX_SEARCH_S = 3600.0
DEFAULT_MAX_TRIALS = 100_000
DEFAULT_MAX_RANDOM_LAYOUTS = 10_000
# Resident memory of one CPU rank besides its model's state: the interpreter with torch and gloo.
# Measured (VmRSS) during a pp=2 dp=2 run of the debug model, 4 layers: 300-310 MB per rank and
# 230 MB for the torchrun agent; 400 MB per rank covers both.
RANK_PROCESS_BYTES = 400e6
_GIB = 2**30


class LimitError(ValueError):
    """A size over its limit (the message names the key that raises it)."""


def over_limit(what: str, value, key: str, limit, why: str = "") -> LimitError:
    """The one-line error of every limit: ``what``, over ``key``=``limit``, why the limit is
    there (optional) and the override that goes past it (``set key=value``)."""
    reason = f"{why}; " if why else ""
    return LimitError(f"{what}: over {key}={limit} ({reason}set {key}={value} to run anyway)")


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def check_devices(
    num_devices: int, *, what: str, limit: int | None, key: str = "limits.max_devices"
) -> None:
    """LimitError when a cluster of ``num_devices`` devices is over ``limit`` (None: default)."""
    limit = DEFAULT_MAX_DEVICES if limit is None else int(limit)
    if num_devices > limit:
        raise over_limit(
            f"{what} has {num_devices} devices",
            num_devices,
            key,
            limit,
            "link matrices, search and simulation grow with the square of the device count",
        )


def check_repeats(repeats: int, *, limit: int | None, key: str = "limits.max_repeats") -> None:
    """LimitError when ``repeats`` is over ``limit`` (None: :data:`DEFAULT_MAX_REPEATS`)."""
    limit = DEFAULT_MAX_REPEATS if limit is None else int(limit)
    if repeats > limit:
        raise over_limit(
            f"repeats={repeats}", repeats, key, limit, "each repeat stores a row per configuration"
        )


def machine_memory_bytes() -> float:
    """This machine's physical memory in bytes (``MemTotal``; sysconf where /proc is absent)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:  # pragma: no cover - not Linux
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def train_memory_bytes(
    model: GPTConfig, *, pp: int, dp: int, micro_batch_size: int, micro_batches: int
) -> float:
    """Host memory of a CPU training run: ``pp``·``dp`` ranks on this machine, fp32 with Adam.

    Per rank: :data:`RANK_PROCESS_BYTES` plus its stage's training memory (the simulator's
    estimate, :func:`system.simulator.memory.training_memory`: 16 bytes per parameter, which is
    also fp32 weights + gradients + Adam's two moments; activations counted twice, fp32 instead
    of fp16, with every micro-batch of the replica in flight, no recomputation). The first stage
    also holds the embedding and the last the logits; a stage has ``ceil(layers / pp)`` layers.
    """
    if min(pp, dp, micro_batch_size, micro_batches) < 1:
        raise ValueError("train_memory_bytes: pp, dp, micro_batch_size, micro_batches must be >= 1")
    layers = max(1, math.ceil(model.num_layers / pp))
    total = 0.0
    for stage in range(pp):
        m = training_memory(
            model,
            layers=layers,
            micro_batch_size=micro_batch_size,
            in_flight=micro_batches,
            embedding=stage == 0,
            logits=stage == pp - 1,
            recompute="none",
        )
        state = m.weights_bytes + m.grads_bytes + m.optimizer_bytes
        total += dp * (RANK_PROCESS_BYTES + state + 2.0 * m.activations_bytes)
    return total


def check_train_memory(
    model: GPTConfig,
    *,
    pp: int,
    dp: int,
    micro_batch_size: int,
    micro_batches: int,
    limit_gib: float | None,
    key: str = "limits.max_memory_gib",
) -> float:
    """The estimate of :func:`train_memory_bytes` in GiB; LimitError when it is over
    ``limit_gib`` (None: :data:`DEFAULT_MEMORY_FRACTION` of this machine's memory)."""
    need = train_memory_bytes(
        model, pp=pp, dp=dp, micro_batch_size=micro_batch_size, micro_batches=micro_batches
    )
    need_gib = need / _GIB
    if limit_gib is None:
        limit_gib = round(DEFAULT_MEMORY_FRACTION * machine_memory_bytes() / _GIB, 1)
    if need_gib > limit_gib:
        raise over_limit(
            f"model {model.name} with {model.num_layers} layers needs about {need_gib:.1f} GiB "
            f"for its {pp * dp} rank{'s' if pp * dp != 1 else ''} on this machine",
            math.ceil(need_gib),
            key,
            limit_gib,
            "fp32 weights, gradients, Adam state and activations of every rank",
        )
    return need_gib
