"""Assignment: every device -> (stage, replica); the scheduler's output and the runtime's input.

``stages[s][r]`` is the device that runs stage ``s`` of pipeline replica ``r``; stages are in
pipeline order. Worked example, 4 devices, pp=2, dp=2:

    >>> a = Assignment.from_stages([[2, 0], [1, 3]])
    >>> a.stage_of.tolist(), a.replica_of.tolist()   # per device 0..3
    ([0, 1, 0, 1], [1, 0, 0, 1])
    >>> a.pipeline(1)                                  # devices of replica 1, stage order
    [0, 3]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Assignment", "identity_assignment", "random_assignment"]


@dataclass(frozen=True, slots=True)
class Assignment:
    """A device layout: ``stages`` is a (pp, dp) int array of distinct device ids 0..D-1."""

    stages: np.ndarray

    def __post_init__(self) -> None:
        s = np.array(self.stages, dtype=np.int64)
        if s.ndim != 2 or s.size == 0:
            raise ValueError(
                f"assignment: stages must be a non-empty (pp, dp) table, got shape {s.shape}"
            )
        if sorted(s.ravel().tolist()) != list(range(s.size)):
            raise ValueError(
                f"assignment: stages must hold each device 0..{s.size - 1} exactly once, "
                f"got {s.tolist()}"
            )
        s.setflags(write=False)
        object.__setattr__(self, "stages", s)

    @classmethod
    def from_stages(cls, stages) -> Assignment:
        return cls(np.asarray(stages))

    @property
    def pp(self) -> int:
        return int(self.stages.shape[0])

    @property
    def dp(self) -> int:
        return int(self.stages.shape[1])

    @property
    def num_devices(self) -> int:
        return int(self.stages.size)

    @property
    def stage_of(self) -> np.ndarray:
        out = np.empty(self.num_devices, dtype=np.int64)
        out[self.stages] = np.arange(self.pp)[:, None]
        return out

    @property
    def replica_of(self) -> np.ndarray:
        out = np.empty(self.num_devices, dtype=np.int64)
        out[self.stages] = np.arange(self.dp)[None, :]
        return out

    def devices(self) -> list[int]:
        return self.stages.ravel().tolist()

    def group(self, stage: int) -> list[int]:
        """Devices holding ``stage`` (its data-parallel group), replica order."""
        return self.stages[stage].tolist()

    def pipeline(self, replica: int) -> list[int]:
        """Devices of one pipeline replica, in stage order."""
        return self.stages[:, replica].tolist()

    def relabel(self, perm) -> Assignment:
        """The same layout after renaming device ``d`` to ``perm[d]``."""
        return Assignment(np.asarray(perm)[self.stages])

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"pp": self.pp, "dp": self.dp, "stages": self.stages.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> Assignment:
        if "stages" not in data:
            raise ValueError("assignment: JSON has no 'stages' field")
        a = cls(np.asarray(data["stages"]))
        for k in ("pp", "dp"):
            if k in data and int(data[k]) != getattr(a, k):
                raise ValueError(
                    f"assignment: {k}={data[k]} disagrees with stages shape {a.stages.shape}"
                )
        return a

    @classmethod
    def load(cls, path: str | Path) -> Assignment:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"assignment file {path} does not exist")
        return cls.from_dict(json.loads(path.read_text()))


def identity_assignment(pp: int, dp: int) -> Assignment:
    """Devices in launch order: stage s holds devices s·dp … s·dp+dp−1 (Megatron's default
    order)."""
    return Assignment(np.arange(pp * dp).reshape(pp, dp))


def random_assignment(pp: int, dp: int, seed: int | np.random.Generator = 0) -> Assignment:
    """A uniformly random rank map: what a user gets by launching in arbitrary order."""
    rng = np.random.default_rng(seed)
    return Assignment(rng.permutation(pp * dp).reshape(pp, dp))
