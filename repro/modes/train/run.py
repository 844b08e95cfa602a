"""``mode=train``: real training on this machine's processes (CPU/gloo or GPUs/NCCL).

    python repro/run.py mode=train system=ours model=debug pp=2 dp=2 iters=3 results_dir=DIR
    python repro/run.py mode=train system=ours model=debug pp=2 dp=2 runtime.layout=random
    python repro/run.py mode=train system=megatron model=debug pp=2 dp=2 results_dir=DIR

``system=ours`` runs our runtime: the config maps to a :class:`system.runtime.spec.RunSpec`
once, one local process per rank is launched and one row is written with
:func:`system.results.make_row`; a failed run writes a row with ``status=error`` (or
``timeout``) and raises. ``system=megatron|deepspeed`` runs the real baselines
(:mod:`repro.modes.train.baselines`).
"""

from __future__ import annotations

import logging

from repro.config.shared import runtime_spec
from repro.modes.train.config import TrainConfig
from system.results import make_row, write_rows
from system.runtime.spec import RunSpec, SpecBase

log = logging.getLogger(__name__)

__all__ = ["run_spec", "run"]


def run_spec(cfg: TrainConfig) -> RunSpec:
    """The RunSpec of ``cfg`` (pp and dp from ``runtime.assignment`` when it is given)."""
    rt, stages = cfg.runtime, None
    if rt.assignment:
        from system.assignment import Assignment

        stages = Assignment.load(rt.assignment).stages.tolist()
    pp = cfg.pp if cfg.pp is not None else (len(stages) if stages else 1)
    dp = cfg.dp if cfg.dp is not None else (len(stages[0]) if stages else 1)
    return runtime_spec(
        cfg,
        pp=pp,
        dp=dp,
        global_batch_size=cfg.batch or SpecBase.global_batch_size,
        stages=stages,
        layout=str(rt.layout),
        dp_mode=str(rt.dp_mode),
        checkpointing=rt.checkpointing,
        lr=rt.lr,
        device=str(rt.device),
        amp=rt.amp,
        metrics_out=cfg.metrics_out,
        trace_path=cfg.trace,
    )


def _run_ours(cfg: TrainConfig) -> dict:
    from system.runtime.launch import launch

    spec = run_spec(cfg)
    spec.validate(spec.world_size)  # bad input: ValueError before any row or process
    model = spec.gpt_config()
    key = {
        "study": cfg.study,
        "mode": "train",
        "system": "ours",
        "model": spec.model,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "seq_length": model.seq_length,
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
    try:
        m = launch(spec, timeout_s=cfg.timeout_s, log_dir=cfg.log_dir)
    except RuntimeError as e:
        status = "timeout" if "timed out" in str(e) else "error"
        write_rows(cfg.results_dir, [make_row(key, status=status, error=str(e)[-2000:])])
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
    path = write_rows(cfg.results_dir, [row])
    log.info(
        "train ours pp=%d dp=%d: median iter %.4f s, final loss %.4f -> %s",
        spec.pp,
        spec.dp,
        m["iter_time_median_s"],
        m["losses"][-1],
        path,
    )
    return row


def run(cfg: TrainConfig) -> dict:
    if cfg.system == "ours":
        return _run_ours(cfg)
    from repro.modes.train.baselines import run_local

    return run_local(cfg)
