"""Which link-sharing model predicts emulated exchanges: register, measure, decide.

The simulator's link-sharing models (:mod:`system.simulator.sharing`) disagree most on
exchanges where a device talks to several peers at once. This experiment runs two such
exchanges on emulated links, with and without a per-device egress cap above the per-destination
HTB classes (:func:`system.emulation.tc.egress_lines`), and scores every model's prediction:

- ``sharded_ps``: our runtime's sharded parameter server over all devices (each sends n − 1
  shards at once: 3 concurrent destinations on the default 4 devices);
- ``ring``: gloo's ring all-reduce (what the baselines' DP runs on CPU), one destination each.

The setting (:class:`SharingExperiment`): the debug case's first four devices (two in Oregon,
two in Virginia: 5 ms and 2 Gbit/s inside a region, 67 ms and 0.79 Gbit/s across, paper case 5's
numbers), bandwidths × 0.05 so the userspace delayer keeps up, a 16 MiB gradient per device, and
a cap of 0.4 Gbit/s before scaling (20 Mbit/s: below a device's summed links in the sharded
exchange, and below every link, so it binds the ring too).

Predictions (:func:`predict`), per run and model, from the simulator on the emulated links
(:meth:`system.emulation.plan.EmulationPlan.scaled_cluster`): ``nic`` takes the run's cap as
every device's NIC (its default, the fastest link, where the run has none); ``flow`` has gloo's
one connection per pair (one stream: the measured pair figure's 1/16); the others as defined.
A model *predicts* a run when the median of its repeats is within :data:`TOLERANCE` of the
prediction; the verdict lists, per run, those models and the closest one.

Steps (``python repro/run.py mode=link_sharing step=STEP results_dir=DIR``, :mod:`.run`):
``register`` writes ``predictions.json`` (commit it before measuring), ``measure`` builds each
emulation, checks its links and times the runs (root; under the netns and cpu locks),
``verdict`` scores them.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd

from system.cases import get_case, is_topology_file
from system.emulation.experiment_limits import (
    MAX_DEVICES,
    are_device_ids,
    check_link_and_run_numbers,
    is_finite_number,
)
from system.emulation.plan import EmulationPlan, make_plan
from system.simulator.collectives import ring_allreduce_end_s, sharded_ps_p2p_s
from system.simulator.sharing import LINK_SHARING, with_link_sharing
from system.simulator.transfers import GLOO

log = logging.getLogger(__name__)

__all__ = [
    "SharingExperiment",
    "TOLERANCE",
    "RUNS",
    "predict",
    "measure",
    "verdict",
    "verdict_markdown",
]

TOLERANCE = 0.20  # a model predicts a run when |measured / predicted − 1| <= this
RUNS = (("sharded_ps", False), ("sharded_ps", True), ("ring", False), ("ring", True))
GLOO_STREAMS = 1  # gloo opens one connection per pair


@dataclass(frozen=True)
class SharingExperiment:
    """The emulated setting (module docstring)."""

    case: str = "debug"
    devices: tuple[int, ...] = (0, 1, 2, 3)
    bandwidth_scale: float = 0.05
    delay_scale: float = 1.0
    egress_cap_gbps: float = 0.4  # before scaling
    nbytes: int = 16 * 2**20  # gradient bytes per device
    repeats: int = 3
    warmup: int = 1
    models: tuple[str, ...] = field(default=LINK_SHARING)

    def __post_init__(self) -> None:
        """Every value in range (a registration is a file a user can edit): one ValueError
        naming the key, before any emulation is built."""
        if is_topology_file(self.case):
            raise ValueError(f"case={self.case!r}: a named case, not a topology file")
        n = get_case(self.case).num_devices  # an unknown case is its own one-line error
        devices = self.devices
        if not are_device_ids(devices, n):
            raise ValueError(
                f"devices={list(devices)}: 2..{MAX_DEVICES} distinct ids of case "
                f"{self.case}'s 0..{n - 1}"
            )
        check_link_and_run_numbers(self, min_nbytes=1)
        if not self.models or any(m not in LINK_SHARING for m in self.models):
            raise ValueError(
                f"models={list(self.models)}: one or more of {', '.join(LINK_SHARING)}"
            )
        for capped in (False, True):  # the scales and the cap: links tc can shape
            self.plan(capped, tag="check")

    @classmethod
    def from_registration(cls, reg) -> SharingExperiment:
        """The experiment a registration (``predictions.json``) names; ValueError when it is
        not one."""
        exp = reg.get("experiment") if isinstance(reg, dict) else None
        if not isinstance(exp, dict):
            raise ValueError("no 'experiment' mapping")
        unknown = sorted(set(exp) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"experiment: unknown key(s) {unknown}")
        lists = {k: tuple(exp[k]) for k in ("devices", "models") if isinstance(exp.get(k), list)}
        return cls(**{**exp, **lists})

    def plan(self, capped: bool, tag: str | None = None) -> EmulationPlan:
        cluster = get_case(self.case).subset(list(self.devices))
        return make_plan(
            cluster,
            bandwidth_scale=self.bandwidth_scale,
            delay_scale=self.delay_scale,
            tag=tag,
            egress_cap_gbps=self.egress_cap_gbps if capped else None,
        )


def _predict_one(exp: SharingExperiment, exchange: str, capped: bool, model: str) -> float:
    plan = exp.plan(capped)
    base = plan.scaled_cluster()
    kw = {}
    if model == "nic" and capped:
        kw["nic_gbps"] = plan.scaled_egress_cap_gbps
    if model == "flow":
        kw["streams"] = GLOO_STREAMS
    c = with_link_sharing(base, model, **kw)
    group = [list(range(c.num_devices))]
    entry = np.zeros((1, c.num_devices))
    if exchange == "sharded_ps":  # receives posted long before (the runtime posts them early)
        return float(sharded_ps_p2p_s(c, group, float(exp.nbytes), entry, posted_s=-60.0).max())
    return float(ring_allreduce_end_s(c, group, float(exp.nbytes), entry, GLOO).max())


def predict(exp: SharingExperiment) -> dict:
    """The registration: setting, rule and every (run, model) prediction in seconds."""
    rows = [
        {
            "exchange": ex,
            "capped": capped,
            "model": m,
            "predicted_s": _predict_one(exp, ex, capped, m),
        }
        for ex, capped in RUNS
        for m in exp.models
    ]
    return {
        "experiment": {**asdict(exp), "devices": list(exp.devices), "models": list(exp.models)},
        "tolerance": TOLERANCE,
        "rule": "a model predicts a run when |median measured / predicted - 1| <= tolerance",
        "predictions": rows,
    }


def measure(exp: SharingExperiment, *, verify_pairs: int = 3) -> list[dict]:
    """Build each emulation (uncapped, capped), check its links, time every run (root)."""
    from system.emulation.netns import Emulation
    from system.emulation.verify import verify_links
    from system.runtime.exchange_bench import ExchangeSpec
    from system.runtime.launch import run_ranks

    rows = []
    for capped in (False, True):
        plan = exp.plan(capped)
        with Emulation(plan) as emu:
            check = verify_links(plan, pairs=verify_pairs, on_fail="warn")
            n = plan.num_devices
            for exchange in ("sharded_ps", "ring"):
                with tempfile.TemporaryDirectory(prefix="dtfm-shr-") as tmp:
                    out = Path(tmp) / "result.json"
                    spec = ExchangeSpec(
                        exchange=exchange,
                        nbytes=exp.nbytes,
                        repeats=exp.repeats,
                        warmup=exp.warmup,
                        result_path=str(out),
                    )
                    (Path(tmp) / "spec.json").write_text(spec.to_json())
                    run_ranks(
                        "system.runtime.exchange_bench",
                        [str(Path(tmp) / "spec.json")],
                        world_size=n,
                        rank_prefix=[emu.exec_prefix(i) for i in range(n)],
                        rank_env=[emu.rank_env(i) for i in range(n)],
                        master_addr=emu.master_addr,
                        timeout_s=600.0,
                        log_dir=tmp,
                    )
                    got = json.loads(out.read_text())
                for k, t in enumerate(got["times_s"]):
                    rows.append(
                        {
                            "exchange": exchange,
                            "capped": capped,
                            "repeat": k,
                            "measured_s": t,
                            "links_ok": bool(check["ok"]),
                            "backend": emu.backend,
                            **plan.scale_record(),
                        }
                    )
                log.info("%s capped=%s: %s", exchange, capped, got["times_s"])
    return rows


def read_registration(path: Path) -> tuple[dict, SharingExperiment]:
    """The registration at ``path`` and its experiment; one ValueError naming the file when it
    is not JSON, lacks a part or holds a value out of range."""
    try:
        reg = json.loads(Path(path).read_text())
        exp = SharingExperiment.from_registration(reg)
        tol = reg.get("tolerance")
        if not is_finite_number(tol) or not 0 < tol <= 1:
            raise ValueError(f"tolerance={tol!r}: a number in (0, 1]")
        rows = reg.get("predictions")
        keys = {"exchange", "capped", "model", "predicted_s"}
        if not isinstance(rows, list) or not rows:
            raise ValueError("no 'predictions' list")
        for r in rows:
            if not isinstance(r, dict) or not keys <= set(r):
                raise ValueError(f"a prediction without {sorted(keys)}: {str(r)[:80]}")
            if not is_finite_number(r["predicted_s"]) or not r["predicted_s"] > 0:
                raise ValueError(f"predicted_s={r['predicted_s']!r}: a finite number > 0")
    except ValueError as e:  # a JSONDecodeError is one too
        raise ValueError(f"registration {path}: {e}") from None
    return reg, exp


def read_measured(path: Path) -> pd.DataFrame:
    """The measured rows at ``path``; one ValueError naming the file when they are not ones
    :func:`measure` writes."""
    try:
        df = pd.read_csv(path)
        missing = sorted({"exchange", "capped", "measured_s"} - set(df.columns))
        if missing:
            raise ValueError(f"no column(s) {missing}")
        t = pd.to_numeric(df["measured_s"], errors="coerce")
        if df.empty or not (np.isfinite(t) & (t > 0)).all():
            raise ValueError("measured_s: no rows, or a value that is not a finite time > 0")
    except ValueError as e:  # pandas' parser errors are ValueErrors
        raise ValueError(f"measured rows {path}: {e}") from None
    return df


def verdict(registration: dict, measured: pd.DataFrame) -> pd.DataFrame:
    """Per run: the median measured time, each model's error, the models within tolerance and
    the closest model."""
    pred = pd.DataFrame(registration["predictions"])
    tol = float(registration["tolerance"])
    out = []
    for (ex, capped), g in measured.groupby(["exchange", "capped"], sort=False):
        med = statistics.median(g["measured_s"])
        p = pred[(pred.exchange == ex) & (pred.capped == capped)].set_index("model").predicted_s
        err = med / p - 1.0
        within = [m for m in p.index if abs(err[m]) <= tol]
        out.append(
            {
                "exchange": ex,
                "capped": bool(capped),
                "repeats": len(g),
                "measured_median_s": med,
                "measured_min_s": float(g["measured_s"].min()),
                "measured_max_s": float(g["measured_s"].max()),
                **{f"pred_{m}_s": float(p[m]) for m in p.index},
                **{f"err_{m}": float(err[m]) for m in p.index},
                "closest": str(err.abs().idxmin()),
                "within_tolerance": ", ".join(within) if within else "none",
            }
        )
    return pd.DataFrame(out)


def verdict_markdown(table: pd.DataFrame) -> str:
    """The verdict as a Markdown table: one line per run, each model's prediction and error."""
    models = [c[len("pred_") : -len("_s")] for c in table.columns if c.startswith("pred_")]
    head = ["exchange", "cap", "measured s (min-max)"] + [f"{m} s (err)" for m in models]
    lines = ["| " + " | ".join(head + ["closest", "within tolerance"]) + " |"]
    lines.append("|" + "---|" * (len(head) + 2))
    for r in table.itertuples(index=False):
        cells = [
            r.exchange,
            "yes" if r.capped else "no",
            f"{r.measured_median_s:.2f} ({r.measured_min_s:.2f}-{r.measured_max_s:.2f})",
        ]
        cells += [
            f"{getattr(r, f'pred_{m}_s'):.2f} ({getattr(r, f'err_{m}'):+.0%})" for m in models
        ]
        lines.append("| " + " | ".join(cells + [r.closest, r.within_tolerance]) + " |")
    return "\n".join(lines)
