"""Pipeline efficiency on CPU loopback: measured iteration time vs the ideal GPipe time.

    python repro/run.py mode=bench_runtime results_dir=results/runtime       # bench.csv
    python repro/run.py mode=bench_runtime pp=2 micro=[4,8,16] iters=6 hidden_size=256

For each setting, run our runtime (one process per stage, gloo on loopback, ``OMP_NUM_THREADS=1``),
take from the run itself, per iteration, the per-stage forward/backward compute time of one
micro-batch (mean over its micro-batches) and the per-stage tail (gradient exchange + optimizer
step), and the per-link time of one activation message (a probe before training); compute that
iteration's ideal GPipe time (:func:`system.runtime.ideal.gpipe_ideal_s`) and report the median
over iterations (after the first) of measured/ideal. The bench's targets (what it aims at, not
what it found): measured/ideal ≤ 1.15 on loopback and ≤ 1.10 on slow links, where the time must
also stay well under the no-overlap time ("communication hidden"). The measured ratios are the
rows of ``results/runtime/``.
Keep ``pp·dp`` at most the number of free cores: the ideal assumes the stages run in parallel.

Slow links (needs root; :mod:`system.emulation`): ``link_mbps=20 delay_ms=1`` puts every rank in
its own network namespace with those links, probes them, and also reports the no-overlap time
(compute + every transfer in sequence)::

    python repro/run.py mode=bench_runtime link_mbps=20 delay_ms=1 micro=[8] \\
        results_dir=results/runtime table=bench_slow.csv

The model and layout keys (``hidden_size``, ``seq_length``, ``layers``, ``pp``, ``dp``, ...) go
to the RunSpec.
"""

from __future__ import annotations

import logging
import statistics

from repro.checks.bench.config import BenchRuntimeConfig
from repro.config.shared import runtime_spec
from system.runtime.ideal import gpipe_ideal_s

log = logging.getLogger(__name__)

__all__ = ["bench_one", "run"]


def _per_stage(values, stage_of, pp, skip_first=True) -> list[float]:
    """values[rank][iter] -> per stage: median over iterations of the max over its replicas."""
    out = []
    for s in range(pp):
        ranks = [r for r, st in enumerate(stage_of) if st == s]
        per_iter = [max(values[r][i] for r in ranks) for i in range(len(values[0]))]
        out.append(
            statistics.median(per_iter[1:] if skip_first and len(per_iter) > 1 else per_iter)
        )
    return out


def _stage_at(values, stage_of, pp, i) -> list[float]:
    """values[rank][iter] -> per stage, iteration i: the max over the stage's replicas."""
    return [max(values[r][i] for r, st in enumerate(stage_of) if st == s) for s in range(pp)]


def bench_one(
    cfg: BenchRuntimeConfig,
    micro_batches: int,
    *,
    launch_kw: dict | None = None,
    ack_delay_s: float = 0.0,
) -> dict:
    """Run one setting; return measured and ideal times (s) and their ratio.

    ``launch_kw`` goes to :func:`system.runtime.launch.launch` (e.g. ``rank_prefix``/``rank_env``/
    ``master_addr`` to run inside emulated-WAN namespaces: the ideal then uses the slow links'
    probed times, which is the "communication hidden" check)."""
    from system.runtime.launch import launch

    spec = runtime_spec(
        cfg, global_batch_size=micro_batches * cfg.micro_batch_size * cfg.dp, probe_links=True
    )
    m = launch(spec, **dict({"timeout_s": 600}, **(launch_kw or {})))
    pp, stage_of, pr = spec.pp, m["stage_of_rank"], m["per_rank"]
    link = []
    for s in range(pp - 1):  # slowest replica's link s -> s+1; the probe's ack leg costs one delay
        probe = max(m["link_probe_s"][r] for r, st in enumerate(stage_of) if st == s)
        link.append(max(probe - ack_delay_s, 1e-6))
    # Pair each iteration with its own ideal (load on shared cores drifts between iterations):
    # measured_i = max over ranks; ideal_i from that iteration's per-stage compute and tail.
    ratios, ideals = [], []
    for i in range(1, spec.iters) if spec.iters > 1 else [0]:
        fwd_i = _stage_at(pr["fwd_mb_s"], stage_of, pp, i)
        bwd_i = _stage_at(pr["bwd_mb_s"], stage_of, pp, i)
        tail_i = [
            a + b
            for a, b in zip(
                _stage_at(pr["dp_s"], stage_of, pp, i),
                _stage_at(pr["optim_s"], stage_of, pp, i),
                strict=True,
            )
        ]
        ideals.append(gpipe_ideal_s(fwd_i, bwd_i, link, micro_batches, tail_i))
        ratios.append(m["iter_time_s"][i] / ideals[-1])
    fwd = _per_stage(pr["fwd_mb_s"], stage_of, pp)
    bwd = _per_stage(pr["bwd_mb_s"], stage_of, pp)
    tail = [
        a + b
        for a, b in zip(
            _per_stage(pr["dp_s"], stage_of, pp),
            _per_stage(pr["optim_s"], stage_of, pp),
            strict=True,
        )
    ]
    ideal = statistics.median(ideals)
    measured = m["iter_time_median_s"]
    serial = micro_batches * (sum(fwd) + sum(bwd) + 2 * sum(link)) + max(tail)
    return {
        "no_overlap_s": serial,
        "pp": pp,
        "dp": spec.dp,
        "micro_batches": micro_batches,
        "hidden_size": spec.gpt_config().hidden_size,
        "seq_length": spec.gpt_config().seq_length,
        "fwd_mb_s": fwd,
        "bwd_mb_s": bwd,
        "link_s": link,
        "tail_s": tail,
        "measured_s": measured,
        "ideal_s": ideal,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "compute_bound_s": micro_batches * max(f + b for f, b in zip(fwd, bwd, strict=True)),
        "iter_time_s": m["iter_time_s"],
    }


def _emulated(link_mbps: float, delay_ms: float, n: int):
    """An Emulation context of ``n`` devices, every pair ``link_mbps`` Mbit/s and ``delay_ms``."""
    import numpy as np

    from system.cluster import Cluster
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan

    off = 1.0 - np.eye(n)
    cluster = Cluster(
        name=f"bench-{link_mbps:g}mbps",
        region_of=tuple(f"r{i}" for i in range(n)),
        host_of=tuple(range(n)),
        delay_ms=off * delay_ms,
        bandwidth_gbps=off * link_mbps / 1e3 + np.eye(n),
    )
    return Emulation(make_plan(cluster))


def run(cfg: BenchRuntimeConfig) -> dict:
    import pandas as pd

    from repro.report.tables import markdown_table
    from system.results import atomic_write_text, path_in

    link_mbps, delay_ms, out = cfg.link_mbps, cfg.delay_ms, path_in(cfg.results_dir, cfg.table)
    if link_mbps is None:
        rows = [bench_one(cfg, m) for m in cfg.micro]
    else:
        n = cfg.pp * cfg.dp
        with _emulated(link_mbps, delay_ms, n) as emu:
            lk = {
                "rank_prefix": [emu.exec_prefix(i) for i in range(n)],
                "rank_env": [emu.rank_env(i) for i in range(n)],
                "master_addr": emu.master_addr,
            }
            rows = [
                dict(
                    bench_one(cfg, m, launch_kw=lk, ack_delay_s=delay_ms / 1e3),
                    link_mbps=link_mbps,
                    delay_ms=delay_ms,
                )
                for m in cfg.micro
            ]

    c = print  # a plain table: wide rows must not wrap
    ms = lambda xs: ",".join(f"{1e3 * x:.1f}" for x in xs)  # noqa: E731
    table = pd.DataFrame(rows)[
        ["pp", "dp", "micro_batches", "fwd_mb_s", "bwd_mb_s", "link_s", "tail_s"]
        + ["measured_s", "ideal_s", "no_overlap_s", "ratio"]
    ]
    headers = {"micro_batches": "M", "fwd_mb_s": "fwd/mb ms (per stage)", "bwd_mb_s": "bwd/mb ms"}
    headers |= {"link_s": "link ms", "tail_s": "tail ms", "measured_s": "measured s"}
    headers |= {"ideal_s": "ideal s", "no_overlap_s": "no-overlap s"}
    headers["ratio"] = "measured/ideal (median of per-iteration ratios)"
    formats = {k: ms for k in ("fwd_mb_s", "bwd_mb_s", "link_s", "tail_s")} | {"ratio": ".3f"}
    c(markdown_table(table, floatfmt=".4f", formats=formats, headers=headers))
    worst = max(r["ratio"] for r in rows)
    target = 1.10 if link_mbps is not None else 1.15  # slow links within 10%, loopback within 15%
    c(
        f"worst measured/ideal = {worst:.3f} (target <= {target:.2f}: "
        f"{'met' if worst <= target else 'NOT met'})"
    )
    df = pd.DataFrame(
        [{k: (str(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]
    )
    atomic_write_text(out, df.to_csv(index=False))
    c(f"wrote {out}")
    return {"worst_ratio": worst, "table": str(out)}
