"""Measure the registered settings on emulated WAN links (needs root; 2 cores are enough).

    python repro/run.py mode=measure predictions=results/validation/round6/predictions.json \\
        results_dir=results/validation/round6 repeats=3     # its measured.csv

For each setting of the predictions file, in file order, ``repeats`` times: build a fresh emulated
network (own namespaces, tag ``v14m<setting>r<repeat>``), verify sampled links (RTT, UDP capacity,
one TCP message; stored in the row), then run every system of the setting with exactly what the
predictions fixed (the scheduled and the random layout's stage table, the baselines at launch
placement or at the registered topology-aware rank map), in an order rotated per repeat. Every run
appends one row to ``out`` at once (atomic rewrite), with the 1-minute load average before and
after, the delayer's release lateness over the run, TCP retransmissions and the verification
summary: the causes of a spread between repeats are in the rows. A setting whose rows are all
present is skipped, so an interrupted measurement resumes; ``deadline=HH:MM`` (UTC) starts no
new setting after it.

Measured iteration time: the median, after ``warmup_iters`` iterations, of the per-iteration
time (max over ranks for our runtime, the ranks' common clock start for the baselines).

Everything the emulation creates lives in namespaces named ``dtfm-v14m…`` and is removed on
exit, error, Ctrl-C and SIGTERM (:class:`system.emulation.netns.Emulation`); after a SIGKILL the
next start (or ``cleanup_only=true``) removes this driver's own leftovers and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path

import pandas as pd

from baselines.placement import Placement
from repro.studies.validation.config import MEASURE_TAG_PREFIX, MeasureConfig
from repro.studies.validation.predict import git_revision, load_predictions, sha256_file
from repro.studies.validation.settings import Setting

log = logging.getLogger("repro.studies.validation.measure")

__all__ = [
    "TAG_PREFIX",
    "tag_for",
    "own_leftovers",
    "cleanup_own",
    "require_root",
    "measure",
]

TAG_PREFIX = MEASURE_TAG_PREFIX  # namespaces dtfm-v14m<ss>r<r>-*: this driver's only


def tag_for(setting_index: int, repeat: int, prefix: str = TAG_PREFIX) -> str:
    tag = f"{prefix}{setting_index:02d}r{repeat}"
    if len(tag) > 12 or not tag.isalnum():
        raise ValueError(f"emulation tag {tag!r} (prefix {prefix!r}) must be <= 12 letters/digits")
    return tag


def own_leftovers(prefix: str = TAG_PREFIX) -> list[str]:
    """This driver's namespaces (``dtfm-<prefix>…``) whose owning process no longer runs."""
    from system.emulation.cleanup import leftovers

    return leftovers(prefix=prefix)


def cleanup_own(prefix: str = TAG_PREFIX) -> list[str]:
    """Remove :func:`own_leftovers` (processes in them killed first) and their state folders."""
    from system.emulation.cleanup import cleanup

    gone = cleanup(prefix=prefix)["namespaces"]
    if gone:
        log.warning("removed %d leftover namespaces of an earlier killed run: %s", len(gone), gone)
    return gone


def require_root(what: str) -> None:
    """One RuntimeError unless root, which the emulated network needs."""
    if os.geteuid() != 0:
        raise RuntimeError(f"{what} emulates the links and needs root")


def _median_after(times: list[float], warmup: int) -> float:
    steady = times[warmup:] if len(times) > warmup else times[-1:]
    return float(statistics.median(steady))


def _run_ours(s: Setting, pred: dict, emu, margin_s: float, timeout_s: float) -> dict:
    from system.runtime.launch import launch
    from system.runtime.spec import RunSpec

    spec = RunSpec(
        model="debug",
        layers=s.num_layers,
        hidden_size=s.hidden_size,
        seq_length=s.seq_length,
        vocab_size=s.vocab_size,
        pp=s.pp,
        dp=s.dp,
        global_batch_size=s.global_batch_size,
        micro_batch_size=s.micro_batch_size,
        iters=s.iters,
        seed=s.seed,
        warmup_iters=s.warmup_iters,
        stages=pred["stages"],
        start="clock",
        start_margin_s=margin_s,
    )
    n = s.num_devices
    m = launch(
        spec,
        rank_prefix=[emu.exec_prefix(i) for i in range(n)],
        rank_env=[emu.rank_env(i) for i in range(n)],
        master_addr=emu.master_addr,
        timeout_s=timeout_s,
    )
    from repro.modes.emulate.run import measured_compute

    comp = measured_compute(m, s.pp, s.warmup_iters)  # per-stage medians in this run
    return {
        "iter_times_s": [float(x) for x in m["iter_time_s"]],
        "run_fwd_s": [float(x) for x in comp.fwd_s],
        "run_bwd_s": [float(x) for x in comp.bwd_s],
        "run_opt_s": [float(x) for x in comp.opt_s],
        "final_loss": float(m["losses"][-1]),
        "start_late_max_s": float(m.get("start_late_max_s", float("nan"))),
    }


def _run_baseline(s: Setting, pred: dict, emu, margin_s: float, timeout_s: float) -> dict:
    from baselines.grid import BaselineSpec, emulation_kwargs, run_point
    from repro.studies.validation.settings import baseline_placement

    framework, placement = baseline_placement(pred["system"])
    rank_map = pred.get("rank_map") if placement == Placement.topology else None
    if placement == Placement.topology and not rank_map:
        raise ValueError(f"{s.name} {pred['system']}: the prediction holds no rank_map")
    spec = BaselineSpec(
        system=framework,
        model="debug",
        layers=s.num_layers,
        hidden_size=s.hidden_size,
        seq_length=s.seq_length,
        vocab_size=s.vocab_size,
        tp=1,
        pp=s.pp,
        dp=s.dp,
        zero=pred.get("zero"),
        global_batch_size=s.global_batch_size,
        micro_batch_size=s.micro_batch_size,
        iters=s.iters,
        seed=s.seed,
        start="clock",
        start_margin_s=margin_s,
    )
    res = run_point(spec, timeout_s=timeout_s, rank_map=rank_map, **emulation_kwargs(emu))
    if res["status"] != "ok":
        raise RuntimeError(f"{spec.label()}: {res['status']}: {str(res.get('error', ''))[-600:]}")
    return {
        "iter_times_s": [float(x) for x in res["iter_times_s"]],
        "final_loss": float(res["losses"][-1]),
    }


def _read(out: Path) -> pd.DataFrame:
    return pd.read_csv(out) if out.exists() else pd.DataFrame()


def _append(out: Path, row: dict) -> None:
    from system.results import atomic_write_text

    df = _read(out)
    flat = {k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in row.items()}
    df = pd.concat([df, pd.DataFrame([flat])], ignore_index=True)
    atomic_write_text(out, df.to_csv(index=False))


def measure(
    predictions_path: str | Path,
    out: str | Path,
    *,
    repeats: int = 3,
    only: list[str] | None = None,
    deadline_utc: str | None = None,
    timeout_s: float = 300.0,
    verify_pairs: int = 4,
    tag_prefix: str = TAG_PREFIX,
) -> dict:
    """Run the registered settings (module docstring); returns which ran and which did not."""
    from repro.studies.validation.predict import scaled_cluster
    from system.emulation import netns
    from system.emulation.plan import make_plan
    from system.emulation.verify import verify_links

    if repeats < 1:
        raise ValueError(f"measure: repeats must be >= 1, got {repeats}")
    doc = load_predictions(predictions_path)
    pred_sha = sha256_file(predictions_path)
    settings = [Setting.from_dict(d) for d in doc["settings"]]
    if only:
        settings = [s for s in settings if s.name in set(only)]
    by_key = {(p["setting"], p["system"]): p for p in doc["predictions"]}
    out = Path(out)
    cleanup_own(tag_prefix)
    sha, dirty = git_revision()
    done, skipped = [], []
    for idx, s in enumerate(settings):
        have = _read(out)
        if not have.empty:
            have = have[(have["setting"] == s.name) & (have["status"] == "ok")]
            if "predictions_sha256" in have.columns:  # rows of these predictions' settings only
                have = have[have["predictions_sha256"] == pred_sha]
        if len(have) >= repeats * len(s.systems):
            log.info("%s: all %d rows present, skipped", s.name, len(have))
            done.append(s.name)
            continue
        if deadline_utc and time.strftime("%H:%M", time.gmtime()) >= deadline_utc:
            log.warning(
                "deadline %s UTC passed: %s and later settings not run", deadline_utc, s.name
            )
            skipped += [x.name for x in settings[idx:]]
            break
        cluster = scaled_cluster(s)
        margin = max(0.5, 4.0 * float(cluster.delay_s.max()))
        from system.cases import get_case

        for r in range(1, repeats + 1):
            systems = list(s.systems)
            k = (r - 1) % len(systems)
            order = systems[k:] + systems[:k]  # rotated: no system always first
            if not have.empty:  # resume: a repeat runs only its missing systems
                present = set(have.loc[have["repeat"] == r, "system"])
                order = [x for x in order if x not in present]
            if not order:
                continue
            plan = make_plan(
                get_case(s.case, "paper").subset(list(s.devices)),
                bandwidth_scale=s.bandwidth_scale,
                delay_scale=s.delay_scale,
                tag=tag_for(idx, r, tag_prefix),
            )
            capacity_gbps = plan.check_capacity()
            with netns.Emulation(plan) as emu:
                t_setup = time.time()
                report = verify_links(
                    plan, pairs=verify_pairs, tolerance=0.10, on_fail="warn", seed=s.seed + r
                )
                for system in order:
                    pred = by_key[(s.name, system)]
                    load0 = os.getloadavg()[0]
                    lag0, rt0 = emu.delayer_stats(), emu.tcp_retransmits()
                    t0 = time.time()
                    row = {
                        "setting": s.name,
                        "system": system,
                        "repeat": r,
                        "case": s.case,
                        "num_devices": s.num_devices,
                        "pp": s.pp,
                        "dp": s.dp,
                        "hidden_size": s.hidden_size,
                        "global_batch_size": s.global_batch_size,
                        "micro_batch_size": s.micro_batch_size,
                        "bandwidth_scale": s.bandwidth_scale,
                        "layout": pred["layout"],
                        "stages": pred.get("stages"),
                        "rank_map": pred.get("rank_map"),
                        "emulation_tag": plan.tag,
                        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
                        "git_revision": sha,
                        "git_dirty": dirty,
                        "predictions_sha256": pred_sha,
                        "nice": os.nice(0),
                        "verify_ok": bool(report["ok"]),
                        "verify_max_rtt_err": report["max_abs_rtt_err"],
                        "verify_max_bw_err": report["max_abs_bw_err"],
                        "verify_max_tcp_err": report["max_abs_tcp_err"],
                        "verify_s": t0 - t_setup,
                        "emu_backend": emu.backend,
                        "delayer_capacity_need_gbps": capacity_gbps,
                    }
                    try:
                        run = (_run_ours if system.startswith("ours") else _run_baseline)(
                            s, pred, emu, margin, timeout_s
                        )
                        lag1, rt1 = emu.delayer_stats(), emu.tcp_retransmits()
                        n_pk = lag1.get("delayed", 0) - lag0.get("delayed", 0)
                        late = lag1.get("sum_late_s", 0.0) - lag0.get("sum_late_s", 0.0)
                        row.update(
                            status="ok",
                            iter_time_s=_median_after(run["iter_times_s"], s.warmup_iters),
                            iter_times_s=run["iter_times_s"],
                            **{
                                k: run[k]
                                for k in ("run_fwd_s", "run_bwd_s", "run_opt_s")
                                if k in run
                            },
                            final_loss=run["final_loss"],
                            delayer_mean_late_ms=1e3 * late / n_pk if n_pk else float("nan"),
                            delayer_packets=n_pk,
                            tcp_retransmits=int(sum(rt1) - sum(rt0)),
                        )
                    except (RuntimeError, TimeoutError) as e:
                        log.error("%s %s repeat %d failed: %s", s.name, system, r, e)
                        row.update(status="error", error=str(e)[-1500:])
                    row.update(
                        wall_s=time.time() - t0,
                        load_avg_1m_before=load0,
                        load_avg_1m_after=os.getloadavg()[0],
                    )
                    _append(out, row)
                    log.info(
                        "%s %-11s r%d: %s s (predicted %.3f s), load %.1f",
                        s.name,
                        system,
                        r,
                        f"{row['iter_time_s']:.3f}" if row["status"] == "ok" else "FAILED",
                        pred["predicted_iter_time_s"],
                        row["load_avg_1m_after"],
                    )
        done.append(s.name)
    return {"done": done, "not_run": skipped, "out": str(out)}


def run(cfg: MeasureConfig) -> dict:
    require_root("the measurement")
    if cfg.cleanup_only:
        removed = cleanup_own(cfg.tag_prefix)
        print(json.dumps({"removed": removed}))
        return {"removed": removed}
    if cfg.nice:
        os.nice(cfg.nice)
    res = measure(
        cfg.predictions,
        cfg.out or str(Path(cfg.results_dir) / "measured.csv"),
        repeats=cfg.repeats,
        only=cfg.only,
        deadline_utc=cfg.deadline,
        timeout_s=cfg.timeout_s,
        tag_prefix=cfg.tag_prefix,
    )
    print(json.dumps(res))
    return dict(res)
