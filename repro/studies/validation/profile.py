"""Compute calibration: a short profile of every stage shape, in its own run.

    python repro/run.py mode=profile settings=results/validation/round1/settings.json \\
        results_dir=results/validation/round1     # writes its compute_profile.json

For each setting, one process per emulated device (the same count the validation run starts,
each with one thread) builds its stage of the setting's GPT (:func:`system.runtime.model.
build_stage`: layers split evenly, embedding on the first stage, head on the last) and times,
after warm-up repeats, one micro-batch forward, its backward and one AdamW step over the stage's
parameters. All processes run at once, so the profile carries the CPU sharing of a run whose
devices all compute together (the compute-bound regime); a run whose devices mostly wait on the
network shares the cores less, which makes these times an upper bound there. The profile holds
per stage the median over the stage's copies and repeats, keyed by the shape
(:func:`shape_key`); the predictions read nothing else from the machine.

Not profiled: the delayer processes' CPU (they move packets during a run) and the sharded
exchange's reductions; :mod:`~repro.studies.validation.calibrate` measures compute inside an
emulated run instead, which includes both.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from repro.studies.validation.config import ProfileConfig
from repro.studies.validation.settings import Setting, load_settings, read_document

__all__ = ["shape_key", "profile_setting", "profile_settings", "load_profile", "stage_times"]

PROFILE_VERSION = 1
_ROOT = Path(__file__).resolve().parents[3]


def shape_key(s: Setting, max_procs: int | None = None) -> str:
    """The profile key of a setting: model shape, stages, micro-batch, processes at once
    (``-c<k>``: at most ``k`` of the ``n`` processes ran at a time)."""
    cap = f"-c{max_procs}" if max_procs and max_procs < s.num_devices else ""
    return (
        f"L{s.num_layers}-h{s.hidden_size}-s{s.seq_length}-v{s.vocab_size}-pp{s.pp}"
        f"-mb{s.micro_batch_size}-n{s.num_devices}{cap}"
    )


def serve() -> None:
    """A profile worker's life (a child process started by :func:`_profile_batch`): its job as
    one JSON line on stdin, "ready" once its stage is built, the start signal "go" on stdin,
    then its timings as one JSON line on stdout."""
    job = json.loads(sys.stdin.readline())
    print(json.dumps(_worker(job)), flush=True)


def _worker(job: dict) -> dict:
    """Time forward, backward and optimizer step of one stage shape (runs in a child process)."""
    import torch

    from system.runtime.model import build_stage, lm_loss
    from system.workload import get_model

    torch.set_num_threads(1)
    m = get_model("debug", job["num_layers"])
    m = type(m)(
        **{
            **{f: getattr(m, f) for f in m.__dataclass_fields__},
            "hidden_size": job["hidden_size"],
            "seq_length": job["seq_length"],
            "vocab_size": job["vocab_size"],
        }
    )
    pp, stage, mbs = job["pp"], job["stage"], job["micro_batch_size"]
    g = torch.Generator().manual_seed(job["seed"])
    model = build_stage(m, pp, stage, job["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    tokens = torch.randint(0, m.vocab_size, (mbs, m.seq_length), generator=g)
    hidden = torch.randn(mbs, m.seq_length, m.hidden_size, generator=g)
    fwd, bwd, step = [], [], []
    # start together: every process has imported torch and built its stage before any times
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise RuntimeError("profile worker: no start signal")
    deadline = time.monotonic() + job["max_s"]
    for k in range(job["warmup"] + job["repeats"]):
        x = tokens if stage == 0 else hidden.clone().requires_grad_(True)
        t0 = time.perf_counter()
        out = model(x)
        t1 = time.perf_counter()
        if stage == pp - 1:
            lm_loss(out, tokens).backward()
        else:
            out.backward(torch.ones_like(out) * 1e-3)
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t3 = time.perf_counter()
        if k >= job["warmup"]:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t3 - t2)
        if k >= job["warmup"] + 2 and time.monotonic() > deadline:
            break
    params = sum(p.numel() for p in model.parameters())
    return {"fwd_s": fwd, "bwd_s": bwd, "opt_s": step, "params": params}


def profile_setting(
    s: Setting,
    *,
    repeats: int = 6,
    warmup: int = 2,
    max_s: float = 30.0,
    max_procs: int | None = None,
) -> dict:
    """Profile every stage of ``s`` with one process per device, all at once (module doc), or
    in batches of at most ``max_procs`` processes at once."""
    cap = s.num_devices if not max_procs else min(max_procs, s.num_devices)
    load_before, t0 = os.getloadavg()[0], time.monotonic()
    results = []
    for b in range(0, s.num_devices, cap):
        results += _profile_batch(s, range(b, min(b + cap, s.num_devices)), repeats, warmup, max_s)
    out = _summarise(s, results, repeats, warmup, max_procs)
    out.update(
        wall_s=time.monotonic() - t0,
        load_avg_1m_before=load_before,
        load_avg_1m_after=os.getloadavg()[0],
    )
    return out


def _jobs(s: Setting, devices, repeats: int, warmup: int, max_s: float) -> list[dict]:
    return [
        {
            "num_layers": s.num_layers,
            "hidden_size": s.hidden_size,
            "seq_length": s.seq_length,
            "vocab_size": s.vocab_size,
            "pp": s.pp,
            "stage": k // s.dp,
            "micro_batch_size": s.micro_batch_size,
            "seed": s.seed + k,
            "repeats": repeats,
            "warmup": warmup,
            "max_s": max_s,
        }
        for k in devices
    ]


def _profile_batch(s: Setting, devices, repeats: int, warmup: int, max_s: float) -> list:
    """Start one worker per device of ``devices`` at once; their (job, result) pairs."""
    jobs = _jobs(s, devices, repeats, warmup, max_s)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    serve = "from repro.studies.validation.profile import serve; serve()"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", serve],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for j in jobs
    ]
    results = []
    try:
        for p, j in zip(procs, jobs, strict=True):
            p.stdin.write(json.dumps(j) + "\n")
            p.stdin.flush()
        for p in procs:  # a worker that dies before "ready" gives EOF here, reported below
            p.stdout.readline()
        for p in procs:
            try:
                p.stdin.write("go\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
        for p in procs:
            out, err = p.communicate(timeout=max_s + 120)
            if p.returncode:
                raise RuntimeError(
                    f"profile of {s.name}: a worker failed ({p.returncode}): {err[-800:]}"
                )
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return list(zip(jobs, results, strict=True))


def _summarise(s: Setting, results: list, repeats: int, warmup: int, max_procs) -> dict:
    per_stage = {"fwd_s": [], "bwd_s": [], "opt_s": [], "params": []}
    for stage in range(s.pp):
        mine = [r for j, r in results if j["stage"] == stage]
        for k in ("fwd_s", "bwd_s", "opt_s"):
            per_stage[k].append(statistics.median(x for r in mine for x in r[k]))
        per_stage["params"].append(mine[0]["params"])
    return {
        "key": shape_key(s, max_procs),
        "processes": s.num_devices,
        "max_procs": max_procs,
        "repeats": repeats,
        "warmup": warmup,
        **per_stage,
    }


def profile_settings(settings: list[Setting], **kw) -> dict:
    """One profile per distinct shape key of ``settings`` (first setting of a key decides)."""
    from system.schema import git_state

    sha, dirty = git_state()
    entries: dict[str, dict] = {}
    for s in settings:
        k = shape_key(s, kw.get("max_procs"))
        if k not in entries:
            entries[k] = profile_setting(s, **kw)
            print(
                f"profile {k}: fwd {entries[k]['fwd_s']} bwd {entries[k]['bwd_s']} "
                f"opt {entries[k]['opt_s']}",
                file=sys.stderr,
            )
    return {
        "profile_version": PROFILE_VERSION,
        "git_sha": sha,
        "git_dirty": dirty,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "torch_threads_per_process": 1,
        "entries": entries,
    }


def load_profile(path: str | Path) -> dict:
    return read_document(
        path,
        "compute profile",
        lambda d: (
            d.get("profile_version") == PROFILE_VERSION and isinstance(d.get("entries"), dict)
        ),
        f"not a version-{PROFILE_VERSION} profile",
        " (run mode=profile or mode=calibrate first)",
    )


def stage_times(profile: dict, s: Setting) -> dict:
    """The profile entry of ``s``: its own (``<shape>@<setting>``, what the in-situ calibration
    of :mod:`~repro.studies.validation.calibrate` writes) or else its shape's; one clear error
    if neither."""
    k = shape_key(s, profile.get("max_procs"))
    entry = profile["entries"].get(f"{k}@{s.name}", profile["entries"].get(k))
    if entry is None:
        raise ValueError(
            f"compute profile has no entry {k!r} for setting {s.name!r}; profile "
            "the settings file again"
        )
    return entry


def run(cfg: ProfileConfig) -> dict:
    from system.results import atomic_write_text

    out = cfg.out or str(Path(cfg.results_dir) / "compute_profile.json")
    if cfg.nice:
        os.nice(cfg.nice)
    settings = load_settings(cfg.settings)
    if cfg.only:
        settings = [s for s in settings if s.name in set(cfg.only)]
    old = load_profile(out) if cfg.merge and Path(out).exists() else None
    if old is not None:
        settings = [s for s in settings if shape_key(s, cfg.max_procs) not in old["entries"]]
    prof = profile_settings(settings, repeats=cfg.repeats, max_procs=cfg.max_procs)
    prof["max_procs"] = cfg.max_procs
    for e in prof["entries"].values():
        e["nice"], e["created_utc"] = os.nice(0), prof["created_utc"]
    if old is not None:
        prof["entries"] = {**old["entries"], **prof["entries"]}
    atomic_write_text(out, json.dumps(prof, indent=1) + "\n")
    print(f"wrote {out}: {len(prof['entries'])} shapes", file=sys.stderr)
    return {"out": out, "shapes": len(prof["entries"])}
