"""The simulator's all-reduce algorithms against the runtime's on emulated links: register,
measure, decide.

The baselines' data-parallel step is simulated with NCCL's ring, its double binary tree or the
two-level all-reduce (:mod:`system.simulator.collectives`). This experiment runs each of them,
implemented over point-to-point in the runtime (:mod:`system.runtime.collectives`), on emulated
case-4 and case-5 links, with and without a per-device egress cap above the per-destination HTB
classes, and scores the simulator's registered prediction of each run:

- ``ring``: NCCL's ring, reduce-scatter + all-gather over point-to-point (predicted by the
  simulator's ``ring``, :func:`system.simulator.collectives.ring_collective_s`);
- ``tree``: NCCL's double binary tree, 512 KiB chunks, half the message per tree;
- ``two_level``: ring reduce-scatter in region blocks, ring or tree across the blocks (the one
  the simulator picks for the setting, recorded in the registration), ring all-gather;
- ``gloo_ring``: ``torch.distributed.all_reduce``, gloo's segmented ring (predicted by
  :func:`system.simulator.collectives.ring_allreduce_end_s` with the ``GLOO`` transport), the ring
  the runtime's other studies measure, for reference.

The setting (:class:`CollectivesExperiment`, described in
``results/emulation/collectives/FINDINGS.md``): 8 devices per case, two in each of four regions in
rank order (a two-level all-reduce has four blocks of two), bandwidths scaled down so the
userspace delayer keeps up, a 16 MiB fp32 gradient per device, with and without an egress cap.

Predictions (:func:`predict`) come from the simulator on the cluster the emulation realises
(:meth:`system.emulation.plan.EmulationPlan.scaled_cluster`): each pair its own link (the ``pair``
sharing model) without the cap, the ``nic`` model at the cap with it — the sharing structure each
emulation has (``results/emulation/sharing/``). A prediction *holds* when the median of the
repeats is within :data:`TOLERANCE` of it. The steps that register, measure and score are
:mod:`repro.studies.collectives.run`'s.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from system.cases import get_case, is_topology_file
from system.emulation.experiment_limits import (
    MAX_DEVICES,
    are_device_ids,
    check_link_and_run_numbers,
)
from system.emulation.plan import EmulationPlan, make_plan
from system.simulator.collectives import (
    TREE_CHUNK_BYTES,
    allreduce_end_s,
    dtree_parents,
    ring_allreduce_end_s,
    two_level_block,
)
from system.simulator.transfers import GLOO

log = logging.getLogger(__name__)

__all__ = [
    "ALGORITHMS",
    "CollectivesExperiment",
    "TOLERANCE",
    "predict",
    "measure",
    "verdict",
    "verdict_markdown",
    "read_registration",
    "read_experiment",
    "read_predictions",
    "read_measured",
    "busiest_link_s",
]

TOLERANCE = 0.10  # a prediction holds when |median measured / predicted − 1| <= this
ALGORITHMS = ("ring", "tree", "two_level", "gloo_ring")
EXCHANGE = {"ring": "ring_p2p", "tree": "tree", "two_level": "two_level", "gloo_ring": "ring"}
PRED_COLUMNS = ("case", "capped", "algorithm", "variant", "block", "predicted_s")


@dataclass(frozen=True)
class CollectivesExperiment:
    """The emulated settings (module docstring): per case its devices in rank order."""

    settings: tuple[tuple[str, tuple[int, ...]], ...] = (
        ("4", (0, 1, 16, 17, 32, 33, 48, 49)),
        ("5", (0, 1, 8, 9, 24, 25, 40, 41)),
    )
    bandwidth_scale: float = 0.05
    delay_scale: float = 1.0
    egress_cap_gbps: float = 0.4  # before scaling
    nbytes: int = 16 * 2**20  # gradient bytes per device
    repeats: int = 3
    warmup: int = 1
    algorithms: tuple[str, ...] = ALGORITHMS

    def __post_init__(self) -> None:
        """Every value in range (a registration is a file a user can edit): one ValueError
        naming the key, before any emulation is built."""
        if not self.settings or len({c for c, _ in self.settings}) != len(self.settings):
            raise ValueError(f"settings={self.settings!r}: one or more distinct cases")
        for case, devices in self.settings:
            if not isinstance(case, str) or is_topology_file(case):
                raise ValueError(f"settings: case {case!r} must be a named case")
            n = get_case(case).num_devices  # an unknown case is its own one-line error
            if not are_device_ids(devices, n):
                raise ValueError(
                    f"settings: devices {list(devices)} of case {case}: 2..{MAX_DEVICES} "
                    f"distinct ids of 0..{n - 1}"
                )
        check_link_and_run_numbers(self, min_nbytes=4)
        if (
            not self.algorithms
            or any(a not in ALGORITHMS for a in self.algorithms)
            or len(set(self.algorithms)) != len(self.algorithms)
        ):
            raise ValueError(
                f"algorithms={list(self.algorithms)}: distinct ones of {', '.join(ALGORITHMS)}"
            )
        for case, _ in self.settings:
            for capped in (False, True):  # the scales and the cap: links tc can shape
                self.plan(case, capped, tag="check")

    @classmethod
    def from_json(cls, exp) -> CollectivesExperiment:
        """The experiment an ``experiment.json`` names; ValueError when it is not one."""
        if not isinstance(exp, dict):
            raise ValueError("not a mapping")
        unknown = sorted(set(exp) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}")
        kw = dict(exp)
        if "settings" in kw:
            s = kw["settings"]
            if not isinstance(s, list) or not all(
                isinstance(x, list) and len(x) == 2 and isinstance(x[1], list) for x in s
            ):
                raise ValueError(f"settings={s!r}: a list of [case, [device, ...]]")
            kw["settings"] = tuple((x[0], tuple(x[1])) for x in s)
        if isinstance(kw.get("algorithms"), list):
            kw["algorithms"] = tuple(kw["algorithms"])
        return cls(**kw)

    def to_json(self) -> dict:
        d = asdict(self)
        d["settings"] = [[c, list(devs)] for c, devs in self.settings]
        d["algorithms"] = list(self.algorithms)
        return d

    def devices(self, case: str) -> tuple[int, ...]:
        return dict(self.settings)[case]

    def plan(self, case: str, capped: bool, tag: str | None = None) -> EmulationPlan:
        cluster = get_case(case).subset(list(self.devices(case)))
        return make_plan(
            cluster,
            bandwidth_scale=self.bandwidth_scale,
            delay_scale=self.delay_scale,
            tag=tag,
            egress_cap_gbps=self.egress_cap_gbps if capped else None,
        )


def _predict_one(exp: CollectivesExperiment, case: str, capped: bool, algo: str) -> dict:
    c = exp.plan(case, capped).scaled_cluster()  # pair, or nic at the cap
    n = c.num_devices
    group, entry = [list(range(n))], np.zeros((1, n))
    row = {"case": case, "capped": capped, "algorithm": algo, "variant": algo, "block": 0}
    if algo == "gloo_ring":
        end = ring_allreduce_end_s(c, group, float(exp.nbytes), entry, GLOO)
    else:
        if algo == "two_level":
            row["block"] = two_level_block(c, group)
            if not row["block"]:
                raise ValueError(f"case {case}: devices {exp.devices(case)} have no region blocks")
        end, row["variant"] = allreduce_end_s(c, group, float(exp.nbytes), entry, algo)
    return {**row, "predicted_s": float(end.max())}


def predict(exp: CollectivesExperiment) -> pd.DataFrame:
    """The registration: every (case, cap, algorithm)'s predicted seconds (:data:`PRED_COLUMNS`;
    ``variant`` names the two-level all-reduce's algorithm across blocks)."""
    rows = [
        _predict_one(exp, case, capped, algo)
        for case, _ in exp.settings
        for capped in (False, True)
        for algo in exp.algorithms
    ]
    return pd.DataFrame(rows, columns=list(PRED_COLUMNS))


def _flows(n: int, nbytes: float, algo: str, variant: str, block: int):
    """(src, dst, bytes) of every transfer ``algo`` makes over positions 0..n−1, summed per
    direction of each pair it uses (``variant`` and ``block``: the two-level one's)."""
    out: dict[tuple[int, int], float] = {}

    def ring(members: list[int], size: float, phases: int) -> None:
        m = len(members)
        for q in range(m):
            key = (members[q], members[(q + 1) % m])
            out[key] = out.get(key, 0.0) + phases * (m - 1) * size / m

    def tree(members: list[int], size: float) -> None:
        parents = dtree_parents(len(members))
        if size <= TREE_CHUNK_BYTES:
            parents = parents[:1]
        for parent in parents:
            for r, p in enumerate(parent):
                if p >= 0:
                    for key in ((members[r], members[p]), (members[p], members[r])):
                        out[key] = out.get(key, 0.0) + size / len(parents)

    everyone = list(range(n))
    if algo in ("ring", "gloo_ring"):
        ring(everyone, nbytes, 2)
    elif algo == "tree":
        tree(everyone, nbytes)
    else:
        for b in range(n // block):
            ring(everyone[b * block : (b + 1) * block], nbytes, 2)  # reduce-scatter + all-gather
        for i in range(block):
            across = everyone[i::block]
            if variant.endswith("/tree"):
                tree(across, nbytes / block)
            else:
                ring(across, nbytes / block, 2)
    return [(a, b, x) for (a, b), x in out.items()]


def busiest_link_s(exp: CollectivesExperiment, case: str, capped: bool, algo: str, pred) -> float:
    """Seconds the busiest shaped resource of the emulation needs for the bytes ``algo`` puts
    through it: an ordered pair's HTB class (its link's goodput), or with the cap a device's
    egress (the cap). A lower bound of any schedule of those transfers, without latency; a
    diagnostic beside the verdict, not a prediction."""
    plan = exp.plan(case, capped)
    c = plan.scaled_cluster()
    flows = _flows(c.num_devices, float(exp.nbytes), algo, pred["variant"], int(pred["block"]))
    worst = max(8.0 * x / c.bandwidth_bps[a, b] for a, b, x in flows)
    cap = plan.scaled_egress_cap_gbps
    if capped and cap is not None:
        egress = np.zeros(c.num_devices)
        for a, _, x in flows:
            egress[a] += x
        worst = max(worst, float(8.0 * egress.max() / (cap * 1e9)))
    return worst


def _time_exchange(emu, plan, exp, algo: str, pred: dict, timeout_s: float) -> list[float]:
    from system.runtime.exchange_bench import ExchangeSpec
    from system.runtime.launch import run_ranks

    n = plan.num_devices
    with tempfile.TemporaryDirectory(prefix="dtfm-col-") as tmp:
        out = Path(tmp) / "result.json"
        inner = pred["variant"].split("/")[-1] if algo == "two_level" else "ring"
        spec = ExchangeSpec(
            exchange=EXCHANGE[algo],
            nbytes=exp.nbytes,
            repeats=exp.repeats,
            warmup=exp.warmup,
            result_path=str(out),
            block=max(2, int(pred["block"])),
            inner=inner,
            timeout_s=timeout_s,
        )
        (Path(tmp) / "spec.json").write_text(spec.to_json())
        run_ranks(
            "system.runtime.exchange_bench",
            [str(Path(tmp) / "spec.json")],
            world_size=n,
            rank_prefix=[emu.exec_prefix(i) for i in range(n)],
            rank_env=[emu.rank_env(i) for i in range(n)],
            master_addr=emu.master_addr,
            timeout_s=timeout_s,
            log_dir=tmp,
        )
        return json.loads(out.read_text())["times_s"]


def measure(
    exp: CollectivesExperiment,
    predictions: pd.DataFrame,
    *,
    verify_pairs: int = 3,
    timeout_s: float = 600.0,
) -> list[dict]:
    """Build each emulation (per case: uncapped, capped), check its links, time every
    algorithm's warm-up and repeats (root). One row per timed repeat."""
    from system.emulation.netns import Emulation
    from system.emulation.verify import verify_links

    pred = predictions.set_index(["case", "capped", "algorithm"])
    rows = []
    for case, _ in exp.settings:
        for capped in (False, True):
            plan = exp.plan(case, capped)
            with Emulation(plan) as emu:
                check = verify_links(plan, pairs=verify_pairs, on_fail="warn")
                for algo in exp.algorithms:
                    p = pred.loc[(case, capped, algo)].to_dict()
                    load_before = os.getloadavg()[0]
                    times = _time_exchange(emu, plan, exp, algo, p, timeout_s)
                    log.info("case %s capped=%s %s: %s", case, capped, algo, times)
                    for k, t in enumerate(times):
                        rows.append(
                            {
                                "case": case,
                                "capped": capped,
                                "algorithm": algo,
                                "variant": p["variant"],
                                "repeat": k,
                                "measured_s": t,
                                "load_avg_1m": load_before,
                                "links_ok": bool(check["ok"]),
                                "verify_busy_cpus": check.get("busy_cpus"),
                                "backend": emu.backend,
                                **plan.scale_record(),
                            }
                        )
    return rows


def read_registration(folder: Path) -> tuple[CollectivesExperiment, pd.DataFrame]:
    """The experiment and predictions registered in ``folder``; one ValueError naming the file
    when one is missing, not what :func:`predict` writes, or holds a value out of range."""
    exp = read_experiment(folder)
    return exp, read_predictions(Path(folder) / "predictions.csv", exp)


def read_experiment(folder: Path) -> CollectivesExperiment:
    """The experiment of ``folder/experiment.json``; one ValueError naming the file."""
    path = Path(folder) / "experiment.json"
    try:
        return CollectivesExperiment.from_json(json.loads(path.read_text()))
    except ValueError as e:  # a JSONDecodeError is one too
        raise ValueError(f"registration {path}: {e}") from None


def read_predictions(path: Path, exp: CollectivesExperiment) -> pd.DataFrame:
    """Predictions of ``exp`` at ``path`` (registered or post hoc); one ValueError naming the
    file when they are not what :func:`predict` writes or miss a run."""
    try:
        df = pd.read_csv(path, dtype={"case": str})
        missing = sorted(set(PRED_COLUMNS) - set(df.columns))
        if missing:
            raise ValueError(f"no column(s) {missing}")
        t = pd.to_numeric(df["predicted_s"], errors="coerce")
        if df.empty or not (np.isfinite(t) & (t > 0)).all():
            raise ValueError("predicted_s: no rows, or a value that is not a finite time > 0")
        want = {
            (c, cap, a) for c, _ in exp.settings for cap in (False, True) for a in exp.algorithms
        }
        have = set(zip(df["case"], df["capped"].astype(bool), df["algorithm"], strict=True))
        if want - have:
            raise ValueError(f"no prediction for {sorted(want - have)[:3]}")
    except ValueError as e:  # pandas' parser errors are ValueErrors
        raise ValueError(f"predictions {path}: {e}") from None
    df["capped"] = df["capped"].astype(bool)
    return df


def read_measured(path: Path) -> pd.DataFrame:
    """The measured rows at ``path``; one ValueError naming the file when they are not ones
    :func:`measure` writes."""
    try:
        df = pd.read_csv(path, dtype={"case": str})
        missing = sorted({"case", "capped", "algorithm", "measured_s"} - set(df.columns))
        if missing:
            raise ValueError(f"no column(s) {missing}")
        t = pd.to_numeric(df["measured_s"], errors="coerce")
        if df.empty or not (np.isfinite(t) & (t > 0)).all():
            raise ValueError("measured_s: no rows, or a value that is not a finite time > 0")
    except ValueError as e:  # pandas' parser errors are ValueErrors
        raise ValueError(f"measured rows {path}: {e}") from None
    df["capped"] = df["capped"].astype(bool)
    return df


def verdict(
    predictions: pd.DataFrame,
    measured: pd.DataFrame,
    *,
    exp: CollectivesExperiment | None = None,
    posthoc: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per run: the median measured time, the registered prediction, its error and whether it
    holds; with ``exp`` the busiest resource's time (:func:`busiest_link_s`), with ``posthoc``
    a later model's prediction and error beside the registered ones."""
    pred = predictions.set_index(["case", "capped", "algorithm"])
    post = None if posthoc is None else posthoc.set_index(["case", "capped", "algorithm"])
    out = []
    for (case, capped, algo), g in measured.groupby(["case", "capped", "algorithm"], sort=False):
        p = pred.loc[(case, capped, algo)]
        med = statistics.median(g["measured_s"])
        err = med / float(p["predicted_s"]) - 1.0
        out.append(
            {
                "case": case,
                "capped": bool(capped),
                "algorithm": algo,
                "variant": p["variant"],
                "repeats": len(g),
                "measured_median_s": med,
                "measured_min_s": float(g["measured_s"].min()),
                "measured_max_s": float(g["measured_s"].max()),
                "predicted_s": float(p["predicted_s"]),
                "err": err,
                "holds": abs(err) <= TOLERANCE,
            }
        )
        if exp is not None:
            out[-1]["busiest_link_s"] = busiest_link_s(exp, case, bool(capped), algo, p)
        if post is not None:
            q = post.loc[(case, capped, algo)]
            out[-1]["posthoc_s"] = float(q["predicted_s"])
            out[-1]["posthoc_err"] = med / float(q["predicted_s"]) - 1.0
            out[-1]["posthoc_holds"] = abs(out[-1]["posthoc_err"]) <= TOLERANCE
    return pd.DataFrame(out)


def verdict_markdown(table: pd.DataFrame) -> str:
    """The verdict as Markdown: one line per run, then per algorithm its errors (the post-hoc
    model's beside the registered one's where the table has them)."""
    post = "posthoc_s" in table.columns
    busy = "busiest_link_s" in table.columns
    head = ["case", "cap", "algorithm", "measured s (min-max)", "registered s", "err", "within 10%"]
    head += ["busiest link s"] if busy else []
    head += ["post-hoc s", "err", "within 10%"] if post else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.itertuples(index=False):
        cells = [
            r.case,
            "yes" if r.capped else "no",
            r.variant,
            f"{r.measured_median_s:.2f} ({r.measured_min_s:.2f}-{r.measured_max_s:.2f})",
            f"{r.predicted_s:.2f}",
            f"{r.err:+.1%}",
            "yes" if r.holds else "no",
        ]
        cells += [f"{r.busiest_link_s:.2f}"] if busy else []
        if post:
            cells += [
                f"{r.posthoc_s:.2f}",
                f"{r.posthoc_err:+.1%}",
                "yes" if r.posthoc_holds else "no",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    head = ["algorithm", "runs", "registered: mean abs err", "max abs err", "within 10%"]
    head += ["post-hoc: mean abs err", "max abs err", "within 10%"] if post else []
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for algo, g in table.groupby("algorithm", sort=False):
        cells = [algo, str(len(g))]
        for e, h in (("err", "holds"),) + ((("posthoc_err", "posthoc_holds"),) if post else ()):
            a = g[e].abs()
            cells += [f"{a.mean():.1%}", f"{a.max():.1%}", f"{int(g[h].sum())} of {len(g)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
