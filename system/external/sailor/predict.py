"""Predict every Sailor plan under a folder: which model each plan trains, the inputs, one row
per plan (an excluded plan keeps its row, with the reason).

Data files (``profiles_tmp.json``, ``llm_info.json``, ``training_config_*.json``,
``multizone_bandwidths_het.json``, ``intra_node_bandwidths.json``) are read from ``data_dir``,
by default the plans folder's parent (the layout of Sailor's validation set as shared). A plan's
model is named by a folder on its path (``OPT-350``, ``GPT-NEO``); plans of the heterogeneous
cluster (``mit/``) train OPT-350M (the set's description).

Held-out sets (:data:`HELD_OUT_SETS`, the heterogeneous cluster's runs, whose measurements the
data's maintainers score): their plans are read through :data:`CONFIG_FIELDS` only
(:func:`~system.external.sailor.plan.load_plan` drops every other field as the file is parsed),
so no measurement of theirs reaches a row, a prediction or a score, even where a file carried one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from system.external.sailor.bandwidth import load_bandwidth_fits, load_intra_node_fits
from system.external.sailor.errors import Finding, SailorFormatError
from system.external.sailor.framework import PlanPrediction, SailorInputs, predict_plan
from system.external.sailor.plan import load_plan, plan_files
from system.external.sailor.profile import (
    load_llm_info,
    load_profiles,
    load_training_config,
)

__all__ = [
    "DATA_FILES",
    "PlanRow",
    "load_inputs",
    "model_of",
    "set_of",
    "predict_plans",
    "round_profile_rows",
    "HELD_OUT_SETS",
    "CONFIG_FIELDS",
    "ROUND_ROWS",
    "held_out",
]

MODEL_FOLDERS = {"opt-350": "OPT-350", "gpt-neo": "GPT-Neo-2.7"}
CLUSTER_MODELS = {"mit": "OPT-350"}  # the heterogeneous cluster's runs are all OPT-350M
TRAINING_CONFIGS = ("training_config_opt_350.json", "training_config_gpt_neo27.json")
HELD_OUT_SETS = ("mit",)  # cluster folders whose measurements are held out
CONFIG_FIELDS = ("zone", "pipeline_list", "mbs", "gbs", "N")  # a plan's configuration
ROUND_ROWS = "forward times are round numbers"  # the warning of a hand-entered profile row
DATA_FILES = (
    "profiles_tmp.json",
    "llm_info.json",
    "multizone_bandwidths_het.json",
    "intra_node_bandwidths.json",
    *TRAINING_CONFIGS,
)


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One plan: ``plan`` relative to the plans folder, its set (cluster/model folder), the
    measurements where the file has them (``real_s``, ``max_mem_bytes``, ``red_grads_s``: the
    logged gradient reduction; None for a held-out set), and the prediction or why there is
    none."""

    plan: str
    set: str
    model: str
    real_s: float | None
    max_mem_bytes: float | None
    prediction: PlanPrediction | None
    excluded: str = ""
    findings: tuple[Finding, ...] = field(default=())
    red_grads_s: float | None = None

    @property
    def round_rows(self) -> bool:
        """Whether the plan uses a profile row with hand-entered (round) forward times."""
        return any(f.message.startswith(ROUND_ROWS) for f in self.findings)


def load_inputs(data_dir) -> SailorInputs:
    d = Path(data_dir)
    shapes = {}
    for name in TRAINING_CONFIGS:
        shape = load_training_config(d / name)
        shapes[shape.name] = shape
    return SailorInputs(
        profiles=load_profiles(d / "profiles_tmp.json"),
        sizes=load_llm_info(d / "llm_info.json"),
        shapes=shapes,
        fits=load_bandwidth_fits(d / "multizone_bandwidths_het.json"),
        intra=load_intra_node_fits(d / "intra_node_bandwidths.json"),
    )


def model_of(rel: str) -> str:
    """The model a plan at ``rel`` (relative path) trains; ValueError if the path names none."""
    parts = [p.lower() for p in Path(rel).parts[:-1]]
    for p in parts:
        if p in MODEL_FOLDERS:
            return MODEL_FOLDERS[p]
    for p in parts:
        if p in CLUSTER_MODELS:
            return CLUSTER_MODELS[p]
    raise ValueError(
        f"{rel}: no folder on the path names the model ({', '.join(MODEL_FOLDERS)}) or a "
        f"cluster whose model is known ({', '.join(CLUSTER_MODELS)})"
    )


def set_of(rel: str) -> str:
    """The set a plan belongs to: its path up to the model folder (``clariden/OPT-350``) or
    the cluster folder (``mit``)."""
    parts = Path(rel).parts[:-1]
    for i, p in enumerate(parts):
        if p.lower() in MODEL_FOLDERS:
            return "/".join(parts[: i + 1])
    for i, p in enumerate(parts):
        if p.lower() in CLUSTER_MODELS:
            return "/".join(parts[: i + 1])
    return "/".join(parts[:1])


def held_out(rel: str) -> bool:
    """Whether the plan at ``rel`` belongs to a held-out set (its first folder names one)."""
    parts = Path(rel).parts
    return len(parts) > 1 and parts[0].lower() in HELD_OUT_SETS


def round_profile_rows(inputs: SailorInputs, model: str, gpu: str, mbs: int, tp: int) -> bool:
    """Whether a profile row's transformer-layer forward times are all whole multiples of
    0.1 ms while its backward times are not (hand-entered values, not the profiler's output)."""
    t = inputs.profiles.get(model, gpu, mbs, tp)
    f, b = t.fwd_s[1:-1] * 1e4, t.bwd_s[1:-1] * 1e4
    return bool(abs(f - f.round()).max() < 1e-9 and abs(b - b.round()).max() > 1e-6)


def predict_plans(
    plans_dir, data_dir=None, *, dp_collective: str = "auto", mixed_tp: bool = False
) -> list[PlanRow]:
    """One :class:`PlanRow` per ``plan_config_*.json`` under ``plans_dir``, path order;
    ``dp_collective`` as :func:`~system.external.sailor.framework.predict_plan` takes it;
    ``mixed_tp`` as :func:`~system.external.sailor.plan.load_plan` takes it."""
    root = Path(plans_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"plans: {plans_dir} is not a folder")
    inputs = load_inputs(root.parent if data_dir is None else data_dir)
    files = plan_files(root)
    if not files:
        raise FileNotFoundError(f"plans: no plan_config_*.json under {plans_dir}")
    rows = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        model = model_of(rel)
        shape = inputs.shapes[model]
        hidden = held_out(rel)
        try:
            plan = load_plan(
                path,
                model,
                shape.num_all_layers,
                _same_time(inputs, model),
                fields=CONFIG_FIELDS if hidden else None,
                mixed_tp=mixed_tp,
            )
        except SailorFormatError as e:
            real = None if hidden else _measured(path, "real")
            red = None if hidden else _measured(path, "red_grads")
            rows.append(PlanRow(rel, set_of(rel), model, real, None, None, str(e), red_grads_s=red))
            continue
        pred = predict_plan(plan, inputs, dp_collective=dp_collective)
        findings = list(pred.findings)
        seen = set()
        for st in plan.stages:
            for rep in st.replicas:
                key = (rep.gpu, rep.tp)
                if key not in seen and round_profile_rows(inputs, model, rep.gpu, plan.mbs, rep.tp):
                    seen.add(key)
                    findings.append(
                        Finding(
                            inputs.profiles.source,
                            f"[{model}][{rep.gpu}][{plan.mbs}][{rep.tp}]",
                            "forward times are round numbers (whole 0.1 ms), not the "
                            "profiler's output; used as given",
                        )
                    )
        rows.append(
            PlanRow(
                rel,
                set_of(rel),
                model,
                plan.real_s,
                plan.max_mem_bytes,
                pred,
                findings=tuple(findings),
                red_grads_s=None if hidden else _measured(path, "red_grads"),
            )
        )
    return rows


def _measured(path, key: str) -> float | None:
    """A measurement field of a plan that is not held out (callers check), or None."""
    try:
        import json

        v = json.loads(Path(path).read_text()).get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    except (OSError, ValueError, AttributeError):
        return None


def _same_time(inputs: SailorInputs, model: str):
    """Whether two layers have identical times in every profile row of ``model``."""

    def same(a: int, b: int) -> bool:
        rows = [t for (m, *_), t in inputs.profiles.rows.items() if m == model]
        return bool(rows) and all(
            t.fwd_s[a] == t.fwd_s[b] and t.bwd_s[a] == t.bwd_s[b] for t in rows
        )

    return same
