"""``mode=quality``: time to a target loss on emulated slow links, every system, one seed.

    python repro/run.py -m sweep=quality                            # cases 4 and 5, seeds 0..2
    python repro/run.py mode=quality case=5 seed=0 study=quality    # one job

One job is one case and one seed: ``pp·dp`` devices of the case (the first of each region) in
network namespaces with the case's delays and ``bandwidth_scale`` × its bandwidths
(:mod:`system.emulation`), then every system of ``systems`` in turn on the same links, data
order and seed, each for ``iters`` iterations of ``batch`` sequences of the corpus
(:mod:`system.runtime.corpus`, ``train_sequences`` training sequences in a seeded order each
epoch). The systems (:data:`~.config.QUALITY_SYSTEMS`):

* ``ours`` and its variants: our runtime on the scheduler's layout for the emulated links,
  uncompressed or with the variant's :class:`~system.compression.Compression` (pipeline
  quantization, AQ-SGD, top-k in the sharded exchange or a compressed ring, DiLoCo), each at
  its method's published setting, not tuned here;
* ``megatron`` / ``deepspeed``: the real baselines (1F1B pipeline and a data-parallel
  all-reduce; DeepSpeed with ZeRO-1) under their topology-aware rank placement.

One learning rate for every system (AdamW ``lr``, DiLoCo's inner optimizer too). Iterations run
back to back (``start=free``) and the clock is the training wall clock from a common start, so
a system's time is its own compute and communication, nothing of the harness. Each run is one
row: losses and wall clock per iteration, the bytes its ranks sent (counted by the runtime)
beside the simulator's prediction of them, held-out losses of its snapshots (our runtime's
systems), the corpus record and the link scaling. After each job the report
(:mod:`.report`) is rebuilt from every row of the study.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time

from repro.studies.quality.config import QUALITY_SYSTEMS as SYSTEMS

log = logging.getLogger(__name__)

__all__ = ["run"]


def _common(cfg) -> dict:
    """The spec fields every system of the job shares (ours' RunSpec and BaselineSpec)."""
    return dict(
        model=str(cfg.model),
        layers=cfg.layers,
        seq_length=cfg.seq_length,
        vocab_size=cfg.vocab_size,
        pp=cfg.pp,
        dp=cfg.dp,
        global_batch_size=cfg.batch,
        micro_batch_size=cfg.micro_batch_size,
        iters=cfg.iters,
        seed=cfg.seed,
        lr=cfg.lr,
        data="kjv",
        train_sequences=cfg.train_sequences,
        start="free",
    )


def _key(cfg, system: str) -> dict:
    """The settings that identify one run's row."""
    return {
        "study": cfg.study,
        "mode": "quality",
        "case": str(cfg.case),
        "system": system,
        "seed": cfg.seed,
        **{k: v for k, v in _common(cfg).items() if k not in ("seed", "data", "start", "layers")},
        "num_layers": cfg.model_layers(),
        "num_devices": cfg.pp * cfg.dp,
        "emu_bandwidth_scale": cfg.bandwidth_scale,
        "emu_delay_scale": cfg.delay_scale,
        "target_iters": cfg.target_iters,
        "window": cfg.window,
        "snapshot_every": cfg.snapshot_every,
    }


def _ours(cfg, name, emu_kw, layout, margin, plan) -> dict:
    from system.runtime.data import make_data
    from system.runtime.evaluate import heldout_losses
    from system.runtime.launch import launch
    from system.runtime.predicted_bytes import predicted_iteration_bytes
    from system.runtime.spec import RunSpec

    with tempfile.TemporaryDirectory(prefix="dtfm-quality-") as snap:
        spec = RunSpec(
            **_common(cfg),
            **SYSTEMS[name],
            stages=layout,
            start_margin_s=margin,
            snapshot_every=cfg.snapshot_every,
            snapshot_dir=snap,
            warmup_iters=1,
        )
        m = launch(
            spec,
            rank_prefix=emu_kw["rank_prefix"],
            rank_env=emu_kw["rank_env"],
            master_addr=emu_kw["master_addr"],
            timeout_s=cfg.timeout_s,
        )
        held = heldout_losses(snap, spec.gpt_config(), spec.pp, make_data(spec).validation())
    pipe, dp = predicted_iteration_bytes(spec)
    return dict(
        losses=m["losses"],
        elapsed_s=m["elapsed_s"],
        iter_time_s=m["iter_time_median_s"],
        pipe_bytes=m["pipe_bytes"],
        dp_bytes=m["dp_bytes"],
        predicted_pipe_bytes=pipe,
        predicted_dp_bytes=dp,
        heldout_steps=[s for s, _ in held],
        heldout_losses=[v for _, v in held],
        compression=m["compression"],
        stages=layout,
    )


def _baseline(cfg, name, emu_kw, scaled, margin) -> dict:
    import numpy as np

    from baselines.grid import BaselineSpec, place_spec, run_point
    from baselines.placement import Placement
    from baselines.worker import calibrated_cpu_hardware
    from system.compression import Compression
    from system.simulator.compressed_traffic import iteration_bytes
    from system.simulator.transfers import GLOO

    spec = BaselineSpec(
        system=name,
        **_common(cfg),
        zero=1 if name == "deepspeed" else None,
        start_margin_s=margin,
    )
    rm = place_spec(spec, scaled, Placement.topology, calibrated_cpu_hardware(spec), GLOO)
    r = run_point(spec, timeout_s=cfg.timeout_s, rank_map=list(rm.devices), **emu_kw)
    if r.get("status") != "ok":
        raise RuntimeError(f"{name}: {r.get('status')}: {str(r.get('error'))[-1500:]}")
    # the baselines send the uncompressed messages of our runtime's layout (1F1B moves the same
    # activations and gradients) and all-reduce the stage's gradients: modelled, not counted
    model = iteration_bytes(spec.workload(), cfg.pp, cfg.dp, Compression(), dp_mode="allreduce")
    return dict(
        losses=r["losses"],
        elapsed_s=np.cumsum(r["iter_times_s"]).tolist(),
        iter_time_s=r["iter_time_s"],
        predicted_pipe_bytes=[model["pipe_bytes"]] * cfg.iters,
        predicted_dp_bytes=[model["dp_bytes"]] * cfg.iters,
        compression="none",
        rank_map=list(rm.devices),
        placement_how=rm.how,
    )


def run(cfg) -> dict:
    """One job: every system of ``cfg.systems`` on the emulated links of ``cfg.case``."""
    from repro.studies.quality.report import build_quality_report
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    from system.results import has_row, make_row, write_rows
    from system.runtime.corpus import corpus_record
    from system.runtime.spec import RunSpec
    from system.scheduler import schedule
    from system.workload import tasklet_sizes

    full = cfg.cluster()
    devices = cfg.picked_devices()
    plan = make_plan(
        full.subset(devices), bandwidth_scale=cfg.bandwidth_scale, delay_scale=cfg.delay_scale
    )
    scaled = plan.scaled_cluster()
    margin = max(0.5, 4.0 * float(scaled.delay_s.max()))  # rank 0's start notice must arrive
    wl = dataclasses.replace(
        RunSpec(**_common(cfg)).workload(), activation_bytes=4, gradient_bytes=4
    )  # the CPU runtime's fp32 messages
    layout = schedule(
        scaled,
        tasklet_sizes(wl, cfg.pp, cfg.dp),
        pp=cfg.pp,
        dp=cfg.dp,
        method="genetic",
        seed=0,  # one layout per case, whatever the training seed
        trials=300,
        time_limit_s=60,
    ).assignment.stages.tolist()
    record = {**corpus_record(), **plan.scale_record(), "devices": devices}
    done, t_job = [], time.monotonic()
    with Emulation(plan, backend=str(cfg.backend)) as emu:
        from baselines.grid import emulation_kwargs

        emu_kw = emulation_kwargs(emu)
        for name in cfg.systems:
            name = str(name)
            key = _key(cfg, name)
            probe = make_row(key)
            if cfg.workflow.skip_finished and has_row(cfg.results_dir, probe["run_id"]):
                log.info(
                    "quality: %s seed %d on case %s is stored; skipped", name, cfg.seed, cfg.case
                )
                continue
            t0 = time.monotonic()
            try:
                if SYSTEMS[name] is None:
                    values = _baseline(cfg, name, emu_kw, scaled, margin)
                else:
                    values = _ours(cfg, name, emu_kw, layout, margin, plan)
                row = make_row(key, **values, **record, wall_s=time.monotonic() - t0)
            except RuntimeError as e:  # a failed run is a row too, never a silent gap
                log.error("quality: %s on case %s failed: %s", name, cfg.case, e)
                row = make_row(key, status="error", error=str(e)[:2000], **record)
            write_rows(cfg.results_dir, [row])
            done.append(row["run_id"])
            log.info(
                "quality case %s seed %d %s: %.0f s (%s)",
                cfg.case,
                cfg.seed,
                name,
                time.monotonic() - t0,
                row["status"],
            )
    report = build_quality_report(cfg.results_dir)
    return {"run_ids": done, "job_s": time.monotonic() - t_job, "report": str(report)}
