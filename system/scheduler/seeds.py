"""Start layouts that respect the cluster's structure (hosts, regions) for the hybrid GA.

A pipeline boundary between two stages is only as fast as its slowest matched pair (paper §3.3),
so a fast boundary needs *every* replica to cross it on a fast link. Layouts that put fast blocks
(the devices of one host, or of one region) into consecutive stages of a replica help only when
all replicas do so at the same stages. :func:`aligned_partition` builds such layouts: blocks are
cut into chunks of ``chunk`` devices and stacked into the replicas' stage columns, each chunk going
to the replica whose next free stage is lowest, so the chunks line up across replicas.

Worked example (case 2's shape: 8 hosts × 4 GPUs + 32 single-GPU hosts, pp = dp = 8): with
``chunk=4`` every replica holds one whole host at stages 0–3 and single GPUs at stages 4–7, so
three of the seven boundaries run inside hosts for all replicas at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from system.cost.partition import PartitionEvaluator

__all__ = ["aligned_partition", "structured_seeds"]

Partition = list[tuple[int, ...]]


def _blocks(labels: Sequence) -> list[list[int]]:
    """Devices grouped by label, in order of first appearance."""
    out: dict = {}
    for d, lab in enumerate(labels):
        out.setdefault(lab, []).append(d)
    return list(out.values())


def aligned_partition(blocks: Sequence[Sequence[int]], pp: int, dp: int, chunk: int) -> Partition:
    """Stage groups of the aligned stacking of ``blocks`` cut into ``chunk``-device pieces.

    Longer pieces are placed first; each goes to the replica with the lowest next free stage
    (ties: lowest replica), split where that replica has less room left.
    """
    if chunk < 1:
        raise ValueError(f"aligned_partition: chunk must be >= 1, got {chunk}")
    pieces = [list(b[i : i + chunk]) for b in blocks for i in range(0, len(b), chunk)]
    pieces.sort(key=len, reverse=True)  # stable: equal lengths keep block order
    stages = np.full((pp, dp), -1, dtype=np.int64)
    nxt = np.zeros(dp, dtype=np.int64)  # next free stage per replica
    for piece in pieces:
        while piece:
            r = int(np.argmin(nxt))  # lowest next free stage, lowest replica on ties
            room = pp - int(nxt[r])
            take, piece = piece[:room], piece[room:]
            stages[nxt[r] : nxt[r] + len(take), r] = take
            nxt[r] += len(take)
    if np.any(stages < 0):
        raise ValueError(f"aligned_partition: blocks hold fewer than pp·dp = {pp * dp} devices")
    return [tuple(sorted(int(x) for x in row)) for row in stages]


def structured_seeds(
    ev: PartitionEvaluator, keep: int = 2, deadline: float | None = None
) -> dict[str, Partition]:
    """The ``keep`` cheapest aligned layouts over hosts and regions and chunk lengths.

    Chunk lengths 1..8 and every block size up to pp are tried. Only structures with a block of
    two or more devices are tried (a cluster of single-GPU hosts in one region has none). Names
    say the structure and chunk, e.g. ``aligned_host_4``. Layouts not costed by ``deadline``
    (a ``time.perf_counter()`` value) are dropped.
    """
    c = ev.cluster
    cands: dict[str, Partition] = {}
    for label, labels in (("host", c.host_of), ("region", c.region_of)):
        blocks = _blocks(labels)
        if max(len(b) for b in blocks) < 2:
            continue
        sizes = {len(b) for b in blocks if len(b) <= ev.pp}
        for chunk in sorted(set(range(1, min(ev.pp, 8) + 1)) | sizes):
            part = aligned_partition(blocks, ev.pp, ev.dp, chunk)
            if part not in cands.values():
                cands[f"aligned_{label}_{chunk}"] = part
    if not cands:
        return {}
    names = list(cands)
    totals = ev.totals([cands[n] for n in names], deadline=deadline)
    order = [k for k in np.argsort(totals, kind="stable")[:keep] if np.isfinite(totals[k])]
    return {names[k]: cands[names[k]] for k in order}
