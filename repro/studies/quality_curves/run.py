"""``mode=quality_curves``: loss against tokens of every method, each tuned, over seeds.

    python repro/run.py mode=quality_curves results_dir=results/quality

Three phases, every run one row of the results store (a restart skips stored runs):

1. **Tune the reference** (:data:`~.methods.REFERENCE`): its learning rates
   (:data:`~.methods.REFERENCE_LRS`) at ``tune_seed``, held-out loss on the validation split;
   ``lr*`` is the rate with the lowest final validation loss.
2. **Tune every other method** with the same budget (:func:`~.methods.trials`, around ``lr*``),
   also on the validation split. A method's setting is the one reaching the reference's
   validation loss at ``select_fraction`` of its run soonest in *time* — iterations to it × the
   simulator's seconds per iteration for that setting at paper scale on ``select_case``
   (:mod:`.project`) — so a compressor's k and bits trade loss against bytes; a setting that
   never reaches it ranks after those that do, by final loss.
3. **Score**: every method's chosen setting at ``seeds`` seeds, held-out loss on the test split.

Runs train in one process each (:func:`system.runtime.inprocess.train_in_process`), ``jobs`` at a
time. The report (:mod:`.report`) is rebuilt from the stored rows at the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

from repro.studies.quality_curves.methods import REFERENCE, hparams_text, setting_of, trials

log = logging.getLogger(__name__)

__all__ = ["run", "choose", "decoded"]


def _train(spec_json: str, eval_every: int, split: str, eval_sequences: int) -> dict:
    """One run in a worker process (joblib): the curve as row values."""
    import torch

    torch.set_num_threads(1)
    from system.runtime.inprocess import train_in_process
    from system.runtime.spec import RunSpec

    spec = RunSpec.from_dict(json.loads(spec_json))
    c = train_in_process(
        spec, eval_every=eval_every, eval_split=split, eval_sequences=eval_sequences
    )
    return dict(
        train_loss=c.train_loss,
        eval_iters=c.eval_iters,
        eval_loss=c.eval_loss,
        dp_bytes_total=c.dp_bytes,
        wall_s=c.wall_s,
    )


def _task(cfg, method: str, phase: str, seed: int, options: dict) -> tuple[dict, str]:
    """(row key, spec JSON) of one run."""
    spec = cfg.base_spec(seed=seed, **options)
    spec_json = spec.to_json()
    split = "test" if phase == "score" else "validation"
    key = {
        "study": cfg.study,
        "mode": "quality_curves",
        "system": method,
        "phase": phase,
        "seed": seed,
        "eval_split": split,
        "eval_every": cfg.eval_every,
        "eval_sequences": cfg.eval_sequences,
        "hparams": hparams_text(options),
        "spec_sha256": hashlib.sha256(spec_json.encode()).hexdigest()[:16],
        "model": str(cfg.model),
        "num_layers": spec.gpt_config().num_layers,
        "global_batch_size": cfg.batch,
        "micro_batch_size": cfg.micro_batch_size,
        "seq_length": cfg.seq_length,
        "iters": cfg.iters,
        "lr": options["lr"],
        "num_devices": cfg.pp * cfg.dp,
        "train_sequences": cfg.train_sequences,
        "compression": spec.compression.label(),
    }
    return key, spec_json


def _execute(cfg, tasks: list[tuple[dict, str]]) -> None:
    """Train the tasks not stored yet, ``cfg.jobs`` at once; each row is written as it ends."""
    from joblib import Parallel, delayed

    from system.results import has_row, make_row, write_rows
    from system.runtime.corpus import corpus_record

    todo = [(k, s) for k, s in tasks if not has_row(cfg.results_dir, make_row(k)["run_id"])]
    if not todo:
        return
    log.info("quality_curves: %d runs to train (%d stored)", len(todo), len(tasks) - len(todo))
    record = corpus_record()
    outs = Parallel(n_jobs=min(cfg.jobs, len(todo)), return_as="generator_unordered")(
        delayed(_indexed)(i, s, cfg.eval_every, k["eval_split"], cfg.eval_sequences)
        for i, (k, s) in enumerate(todo)
    )
    for i, values in outs:
        key = todo[i][0]
        write_rows(cfg.results_dir, [make_row(key, **values, **record)])
        log.info(
            "quality_curves: %s %s seed %d %s: final held-out %.4f (%.0f s)",
            key["phase"],
            key["system"],
            key["seed"],
            key["hparams"],
            values["eval_loss"][-1],
            values["wall_s"],
        )


def _indexed(i: int, *args) -> tuple[int, dict]:
    return i, _train(*args)


def _rows(cfg, tasks) -> list[dict]:
    """The stored rows of ``tasks`` (every one must be stored by now)."""
    from system.results import make_row, read_rows

    ids = [make_row(k)["run_id"] for k, _ in tasks]
    df = read_rows(cfg.results_dir)
    df = df[df["run_id"].isin(ids)]
    if len(df) != len(ids):
        raise RuntimeError(f"quality_curves: {len(ids) - len(df)} runs are missing from the store")
    by_id = {r["run_id"]: decoded(r) for r in df.to_dict("records")}
    return [by_id[i] for i in ids]


def decoded(row: dict) -> dict:
    """A stored row with its JSON list columns as lists."""
    out = dict(row)
    for c in ("train_loss", "eval_iters", "eval_loss"):
        if isinstance(out.get(c), str):
            out[c] = json.loads(out[c])
    return out


def choose(cfg, method: str, rows: list[dict], target: float) -> dict:
    """The trial row ``method`` keeps (module docstring, phases 1 and 2)."""
    from repro.studies.quality_curves.project import paper_iter_time_s
    from repro.studies.quality_curves.targets import iters_to_target

    if method == REFERENCE:
        return min(rows, key=lambda r: (r["eval_loss"][-1], r["lr"]))

    def rank(r):
        n = iters_to_target(r["eval_iters"], r["eval_loss"], target)
        if n is None:
            return (1, r["eval_loss"][-1])
        return (0, n * paper_iter_time_s(cfg.select_case, setting_of(r["hparams"])))

    return min(rows, key=rank)


def select(cfg, tuned: dict[str, list[dict]]) -> tuple[dict[str, dict], float]:
    """(each method's chosen setting, the selection target) from its tuning rows (phases 1 and
    2 of the module docstring); ``tuned`` maps a method to its decoded rows, the reference's
    among them."""
    from repro.studies.quality_curves.targets import loss_at

    ref = choose(cfg, REFERENCE, tuned[REFERENCE], 0.0)
    at = int(round(cfg.select_fraction * cfg.iters / cfg.eval_every)) * cfg.eval_every
    target = loss_at(ref["eval_iters"], ref["eval_loss"], at)
    chosen = {REFERENCE: {"lr": float(ref["lr"])}}
    for m, rows in tuned.items():
        if m != REFERENCE:
            chosen[m] = setting_of(choose(cfg, m, rows, target)["hparams"])
    return chosen, target


def chosen_from_store(cfg) -> dict[str, dict]:
    """Each method's chosen setting from the tuning rows stored in ``cfg.results_dir``."""
    from system.results import read_rows

    df = read_rows(cfg.results_dir)
    if df.empty or "phase" not in df.columns:
        raise ValueError(f"results_dir={cfg.results_dir}: no mode=quality_curves rows")
    t = df[
        (df["mode"] == "quality_curves")
        & (df["phase"] == "tune")
        & (df["status"] == "ok")
        & (df["seed"] == cfg.tune_seed)
        & (df["iters"] == cfg.iters)
    ]
    methods = [str(m) for m in cfg.methods]
    tuned = {m: [decoded(r) for r in t[t["system"] == m].to_dict("records")] for m in methods}
    short = [m for m, rows in tuned.items() if not rows]
    if short:
        raise ValueError(f"results_dir={cfg.results_dir}: no tuning rows yet for {short}")
    return select(cfg, tuned)[0]


def run(cfg) -> dict:
    os.environ["OMP_NUM_THREADS"] = "1"  # the joblib workers inherit it
    t0 = time.monotonic()
    methods = [str(m) for m in cfg.methods]
    seeds = range(cfg.seed, cfg.seed + cfg.seeds)

    ref_tasks = [_task(cfg, REFERENCE, "tune", cfg.tune_seed, o) for o in trials(REFERENCE, None)]
    _execute(cfg, ref_tasks)
    ref_rows = _rows(cfg, ref_tasks)
    lr_star = float(choose(cfg, REFERENCE, ref_rows, 0.0)["lr"])
    log.info("quality_curves: lr* = %g", lr_star)

    tune = {
        m: [_task(cfg, m, "tune", cfg.tune_seed, o) for o in trials(m, lr_star)]
        for m in methods[1:]
    }
    ref_scored = [_task(cfg, REFERENCE, "score", s, {"lr": lr_star}) for s in seeds]
    _execute(cfg, ref_scored + [t for ts in tune.values() for t in ts])

    tuned = {REFERENCE: ref_rows, **{m: _rows(cfg, ts) for m, ts in tune.items()}}
    chosen, target = select(cfg, tuned)
    log.info("quality_curves: selection target %.4f; chosen %s", target, chosen)
    scored = [_task(cfg, m, "score", s, chosen[m]) for m in methods[1:] for s in seeds]
    _execute(cfg, scored)
    return {"chosen": chosen, "job_s": time.monotonic() - t0}
