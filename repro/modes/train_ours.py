"""``mode=train system=ours``: train with our runtime and write one result row.

    python repro/run.py mode=train system=ours model=debug pp=2 dp=2 iters=3 results_dir=DIR
    python repro/run.py mode=train system=ours model=debug pp=2 dp=2 runtime.layout=random

Maps the Hydra config to a :class:`system.runtime.spec.RunSpec` once (nothing below sees a
DictConfig), launches one local process per rank and writes a row with
:func:`system.results.make_row` / :func:`system.results.write_rows`. A failed run writes a row
with ``status=error`` (or ``timeout``) and raises.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from system.results import make_row, write_rows
from system.runtime.spec import RunSpec

log = logging.getLogger(__name__)

__all__ = ["spec_from_cfg", "run"]


def spec_from_cfg(cfg: DictConfig) -> RunSpec:
    """The RunSpec of a Hydra config (``runtime.*`` keys are optional)."""
    rt = cfg.get("runtime") or {}
    stages = None
    if rt.get("assignment"):
        from system.assignment import Assignment

        stages = Assignment.load(str(rt["assignment"])).stages.tolist()
    pp = cfg.get("pp") if cfg.get("pp") is not None else (len(stages) if stages else 1)
    dp = cfg.get("dp") if cfg.get("dp") is not None else (len(stages[0]) if stages else 1)
    batch = cfg.get("batch")
    return RunSpec(
        model=str(cfg.get("model", "debug")),
        layers=None if cfg.get("layers") is None else int(cfg.layers),
        pp=int(pp),
        dp=int(dp),
        global_batch_size=int(batch) if batch is not None else 8,
        micro_batch_size=int(cfg.get("micro_batch_size", 1)),
        iters=int(cfg.get("iters", 3)),
        seed=int(cfg.get("seed", 0)),
        stages=stages,
        layout=str(rt.get("layout", "identity")),
        dp_mode=str(rt.get("dp_mode", "sharded_ps")),
        checkpointing=bool(rt.get("checkpointing", False)),
        lr=float(rt.get("lr", 3e-3)),
        device=str(rt.get("device", "cpu")),
        amp=bool(rt.get("amp", False)),
        metrics_out=None if cfg.get("metrics_out") is None else str(cfg.metrics_out),
    )


def run(cfg: DictConfig) -> dict:
    from system.runtime.launch import launch

    spec = spec_from_cfg(cfg)
    spec.validate(spec.world_size)  # bad input: ValueError before any row or process
    rt = cfg.get("runtime") or {}
    cfgm = spec.gpt_config()
    key = {
        "study": str(cfg.get("study", "adhoc")),
        "mode": "train",
        "system": "ours",
        "model": spec.model,
        "num_layers": cfgm.num_layers,
        "hidden_size": cfgm.hidden_size,
        "seq_length": cfgm.seq_length,
        "global_batch_size": spec.global_batch_size,
        "micro_batch_size": spec.micro_batch_size,
        "pp": spec.pp,
        "dp": spec.dp,
        "tp": 1,
        "num_devices": spec.world_size,
        "seed": spec.seed,
        "iters": spec.iters,
        "layout": "assignment" if spec.stages is not None else spec.layout,
        "stages": spec.assignment().stages.tolist(),
        "dp_mode": spec.dp_mode,
        "recompute": spec.checkpointing,
        "device": spec.device,
        "case": "local",  # this machine's processes, not one of the paper's cases
    }
    results_dir = str(cfg.results_dir)
    try:
        m = launch(spec, timeout_s=float(rt.get("timeout_s", 600)))
    except RuntimeError as e:
        status = "timeout" if "timed out" in str(e) else "error"
        write_rows(results_dir, [make_row(key, status=status, error=str(e)[-2000:])])
        raise
    row = make_row(
        key,
        status="ok",
        iter_time_s=m["iter_time_median_s"],
        iter_times_s=m["iter_time_s"],
        tokens_per_s=m["tokens_per_s"],
        tflops=m["tflops"],
        pflops=m["tflops"] / 1e3,
        tflops_per_device=m["tflops_per_device"],
        losses=m["losses"],
        final_loss=m["losses"][-1],
        compute_time_s=m["compute_s_median"],
        comm_wait_time_s=m["wait_s_median"],
        dp_time_s=m["dp_s_median"],
        micro_batches=m["micro_batches"],
    )
    path = write_rows(results_dir, [row])
    log.info(
        "train ours pp=%d dp=%d: median iter %.4f s, final loss %.4f -> %s",
        spec.pp,
        spec.dp,
        m["iter_time_median_s"],
        m["losses"][-1],
        path,
    )
    return row
