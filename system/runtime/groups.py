"""Rank positions: rank -> (stage, replica) from a scheduler assignment; per-stage DP groups.

Rank ``d`` is device ``d`` of the :class:`~system.assignment.Assignment`; it runs stage
``stage_of[d]`` of replica ``replica_of[d]``. Its pipeline neighbours are the devices of the same
replica at the stages before and after; its data-parallel group (paper §2: "group j holds stage j
for every replica") is row ``stage_of[d]`` of the table. Example, ``stages=[[2, 0], [1, 3]]``:

    >>> from system.assignment import Assignment
    >>> p = rank_position(Assignment.from_stages([[2, 0], [1, 3]]), rank=0)
    >>> (p.stage, p.replica, p.prev_rank, p.next_rank, p.dp_ranks)
    (0, 1, None, 3, (2, 0))
"""

from __future__ import annotations

from dataclasses import dataclass

from system.assignment import Assignment

__all__ = ["RankPosition", "rank_position", "make_stage_groups"]


@dataclass(frozen=True, slots=True)
class RankPosition:
    """Where one rank sits: its stage, replica, pipeline neighbours and DP group (global ranks)."""

    rank: int
    stage: int
    replica: int
    pp: int
    dp: int
    prev_rank: int | None  # previous stage of the same replica (None on stage 0)
    next_rank: int | None  # next stage of the same replica (None on the last stage)
    dp_ranks: tuple[int, ...]  # devices holding this stage, replica order

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1


def rank_position(assignment: Assignment, rank: int) -> RankPosition:
    """The position of ``rank`` (= device id) in ``assignment``."""
    if not 0 <= rank < assignment.num_devices:
        raise ValueError(
            f"rank_position: rank {rank} is not a device of the assignment "
            f"(0..{assignment.num_devices - 1})"
        )
    s = int(assignment.stage_of[rank])
    r = int(assignment.replica_of[rank])
    pipe = assignment.pipeline(r)
    return RankPosition(
        rank=rank,
        stage=s,
        replica=r,
        pp=assignment.pp,
        dp=assignment.dp,
        prev_rank=pipe[s - 1] if s > 0 else None,
        next_rank=pipe[s + 1] if s < assignment.pp - 1 else None,
        dp_ranks=tuple(assignment.group(s)),
    )


def make_stage_groups(assignment: Assignment, rank: int):
    """Create one process group per stage (every rank must call this, same order); return ours.

    Returns ``None`` when dp == 1 (no data-parallel exchange). ``torch.distributed`` numbers group
    ranks by sorted global rank, so shard ``k`` of the parameter server belongs to the ``k``-th
    smallest rank of the group on every member.
    """
    import torch.distributed as dist

    if assignment.dp == 1:
        return None
    mine = None
    for s in range(assignment.pp):
        ranks = sorted(assignment.group(s))
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g
    return mine
