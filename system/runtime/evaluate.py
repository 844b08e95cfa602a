"""Held-out loss of a run's snapshots, after the run, in one process.

A run with ``snapshot_every`` (:class:`~system.runtime.spec.RunSpec`) leaves, per stage of
replica 0, ``stage<s>.pt``: the stage's parameters at every snapshot step. All replicas hold
the same parameters after a data-parallel step (and after a DiLoCo outer step, the only steps a
DiLoCo run snapshots), so replica 0 stands for the model. :func:`assemble` puts the stages back
into the whole GPT (stage ``s``'s block ``i`` is the model's block ``first_layer + i``), and
:func:`heldout_losses` evaluates each snapshot on the corpus's held-out sequences — off the
training clock, with no link in between.
"""

from __future__ import annotations

from pathlib import Path

import torch

from system.runtime.model import build_model, lm_loss
from system.workload import GPTConfig

__all__ = ["load_stage_snapshots", "assemble", "heldout_loss", "heldout_losses"]


def load_stage_snapshots(snapshot_dir: str | Path, pp: int) -> list[dict]:
    """The ``pp`` stage files of a run, checked to hold the same snapshot steps."""
    records = []
    for s in range(pp):
        path = Path(snapshot_dir) / f"stage{s}.pt"
        if not path.exists():
            raise FileNotFoundError(f"no snapshot file {path} (did the run set snapshot_every?)")
        records.append(torch.load(path, map_location="cpu", weights_only=True))
    steps = records[0]["steps"]
    if any(r["steps"] != steps for r in records):
        raise ValueError(f"snapshots in {snapshot_dir}: the stages hold different steps")
    return records


def assemble(cfg: GPTConfig, records: list[dict], index: int) -> torch.nn.Module:
    """The whole GPT from snapshot ``index`` of every stage record."""
    state = {}
    for rec in records:
        for key, value in rec["states"][index].items():
            if key.startswith("blocks."):
                _, i, rest = key.split(".", 2)
                key = f"blocks.{rec['first_layer'] + int(i)}.{rest}"
            state[key] = value
    model = build_model(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, tokens: torch.Tensor, batch: int = 16) -> float:
    """Mean next-token loss of ``model`` on ``tokens`` (n, seq + 1)."""
    total, count = 0.0, 0
    for i in range(0, tokens.shape[0], batch):
        chunk = tokens[i : i + batch]
        loss = lm_loss(model(chunk[:, :-1]), chunk[:, 1:])
        total += float(loss) * chunk.shape[0]
        count += chunk.shape[0]
    return total / count


def heldout_losses(
    snapshot_dir: str | Path, cfg: GPTConfig, pp: int, tokens: torch.Tensor
) -> list[tuple[int, float]]:
    """(step, held-out loss) for every snapshot of a run."""
    records = load_stage_snapshots(snapshot_dir, pp)
    return [
        (int(step), heldout_loss(assemble(cfg, records, k), tokens))
        for k, step in enumerate(records[0]["steps"])
    ]
