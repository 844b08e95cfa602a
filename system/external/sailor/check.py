"""Every input of a folder of Sailor plans checked before any prediction runs or any file is
written: one :class:`~system.external.sailor.errors.SailorFormatError` (or
:class:`~system.limits.LimitError`) naming the file, the field and what is wrong.

Each file on its own is checked by its loader (a regular file inside its folder, a size cap
before reading, types and finite ranges: :mod:`~system.external.sailor.errors`,
:mod:`~system.external.sailor.plan`, :mod:`~system.external.sailor.profile`,
:mod:`~system.external.sailor.bandwidth`). :func:`check_inputs` adds what needs two files:

- every data file is a file of the data folder, not a link out of it;
- every model a plan trains is named by exactly one training config, and every profile and size
  row of that model has the config's ``num_all_layers`` layers;
- every plan fits this machine's limits (:mod:`system.limits`: its devices, all GPUs of its
  nodes, within ``limits.max_devices``; its micro-batches per iteration within
  ``limits.max_micro_batches``);
- every row a plan reads exists and is physical: the profile of each (GPU, micro-batch size,
  TP degree) with forward times > 0 on every layer, backward times > 0 on every layer past the
  embedding (whose backward the shared profiles record as 0 on some rows) and an optimizer step
  > 0; the sizes at each TP degree and at TP 1 (a tied head's word embedding at least one row
  per GPU); an intra-node fit for every node whose TP group spans several GPUs (without one its
  links would be free); an inter-node fit for every pair of its nodes.

A plan of a held-out set is read through its configuration fields only, as the prediction
reads it (:data:`~system.external.sailor.predict.CONFIG_FIELDS`): no measurement of it is
checked or shown. A plan whose layer list does not make up its model is not refused here: it is
predicted as an excluded plan with that reason (:class:`~system.external.sailor.plan.
LayerMismatch`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from system.external.sailor.errors import SailorFormatError, inside
from system.external.sailor.framework import SailorInputs, head_is_tied
from system.external.sailor.plan import LayerMismatch, SailorPlan, load_plan, plan_files
from system.external.sailor.predict import (
    CONFIG_FIELDS,
    DATA_FILES,
    TRAINING_CONFIGS,
    _same_time,
    held_out,
    load_inputs,
    model_of,
)
from system.external.sailor.profile import load_training_config
from system.limits import check_devices, over_limit

__all__ = ["check_inputs"]


def check_inputs(
    plans_dir, data_dir=None, *, max_devices: int | None = None, max_micro_batches: int
) -> None:
    """Refuse the first bad input of ``plans_dir`` and its data files (module docstring)."""
    root = Path(plans_dir)
    data = root.parent if data_dir is None else Path(data_dir)
    for name in DATA_FILES:
        inside(data / name, data, str(data))
    files = plan_files(root)
    if not files:
        raise SailorFormatError(root, "(folder)", "no plan_config_*.json under it")
    models = {p: model_of(p.relative_to(root).as_posix()) for p in files}
    _check_models(data, models)
    inputs = load_inputs(data)
    for model in sorted(set(models.values())):
        _check_layer_counts(inputs, model, data)
    for path, model in models.items():
        shape = inputs.shapes[model]
        rel = path.relative_to(root).as_posix()
        try:
            plan = load_plan(
                path,
                model,
                shape.num_all_layers,
                _same_time(inputs, model),
                fields=CONFIG_FIELDS if held_out(rel) else None,  # held out: no measurement read
            )
        except LayerMismatch:
            continue  # predicted as an excluded plan, with the reason
        _check_plan(plan, inputs, max_devices=max_devices, max_micro_batches=max_micro_batches)


def _check_models(data: Path, models: dict[Path, str]) -> None:
    """Each model a plan trains (``models``: plan -> model) is named by exactly one training
    config."""
    named = {name: load_training_config(data / name).name for name in TRAINING_CONFIGS}
    twice = sorted(m for m, c in Counter(named.values()).items() if c > 1)
    if twice:
        files = [n for n, m in named.items() if m == twice[0]]
        raise SailorFormatError(
            data / files[1], "model", f"{twice[0]!r} is named by {files[0]} too"
        )
    for model in sorted(set(models.values()) - set(named.values())):
        example = next(p for p, m in models.items() if m == model)
        listed = ", ".join(f"{n} names {m!r}" for n, m in named.items())
        raise SailorFormatError(
            data / TRAINING_CONFIGS[0],
            "model",
            f"no training config names {model!r}, the model of plans such as {example.name} "
            f"({listed})",
        )


def _check_layer_counts(inputs: SailorInputs, model: str, data: Path) -> None:
    layers = inputs.shapes[model].num_all_layers
    config = _config_of(model, data)
    for (m, gpu, mbs, tp), row in inputs.profiles.rows.items():
        if m == model and row.num_layers != layers:
            raise SailorFormatError(
                inputs.profiles.source,
                f"[{m}][{gpu}][{mbs}][{tp}]",
                f"{row.num_layers} layers, {config} gives {model} num_all_layers={layers}",
            )
    for (m, tp), row in inputs.sizes.rows.items():
        if m == model and row.num_layers != layers:
            raise SailorFormatError(
                inputs.sizes.source,
                f"[{m}][{tp}]",
                f"{row.num_layers} layers, {config} gives {model} num_all_layers={layers}",
            )


def _config_of(model: str, data: Path) -> str:
    for name in TRAINING_CONFIGS:
        if load_training_config(data / name).name == model:
            return name
    return "its training config"  # pragma: no cover - _check_models ran first


def _check_plan(
    plan: SailorPlan, inputs: SailorInputs, *, max_devices: int | None, max_micro_batches: int
) -> None:
    f = plan.file
    nodes = plan.nodes()
    check_devices(sum(n.gpus for n in nodes), what=f"{f}: the plan", limit=max_devices)
    if plan.micro_batches > max_micro_batches:
        raise over_limit(
            f"{f}: gbs={plan.gbs} with mbs={plan.mbs} and dp={plan.dp} is "
            f"{plan.micro_batches} micro-batches per iteration",
            plan.micro_batches,
            "limits.max_micro_batches",
            max_micro_batches,
            "each is simulated",
        )
    needed_by = f" (needed by {f})"
    seen = set()
    for st in plan.stages:
        for rep in st.replicas:
            key = (rep.gpu, rep.tp)
            if key in seen:
                continue
            seen.add(key)
            times = inputs.profiles.get(plan.model, rep.gpu, plan.mbs, rep.tp, where=needed_by)
            where = f"[{plan.model}][{rep.gpu}][{plan.mbs}][{rep.tp}]"
            for name, values, first in (("fwd_s", times.fwd_s, 0), ("bwd_s", times.bwd_s, 1)):
                bad = [int(i) for i in range(first, values.size) if not values[i] > 0]
                if bad:
                    raise SailorFormatError(
                        inputs.profiles.source,
                        f"{where}[{bad[0]}] ({name})",
                        f"time {values[bad[0]]:g} s; a layer's time must be > 0{needed_by}",
                    )
            if not times.profiled_opt_s > 0:
                raise SailorFormatError(
                    inputs.profiles.source,
                    f"{where}[*][2] (opt_s)",
                    f"optimizer step 0 s; it must be > 0{needed_by}",
                )
            for tp in (rep.tp, 1):
                if (plan.model, tp) not in inputs.sizes.rows:
                    raise SailorFormatError(
                        inputs.sizes.source,
                        f"[{plan.model}][{tp}]",
                        f"no sizes for this model and TP degree{needed_by}",
                    )
            _check_tied_head(plan.model, rep.tp, inputs, needed_by)
            if rep.tp > 1 and (rep.gpu, rep.gpus) not in inputs.intra:
                raise SailorFormatError(
                    _intra_source(inputs),
                    f"[{rep.gpu}][{rep.gpus}]",
                    f"no intra-node fit for a node of {rep.gpus} {rep.gpu} whose TP group spans "
                    f"{rep.tp} of them{needed_by}",
                )
    counts = Counter(nodes)
    for a in counts:
        for b in counts:
            if a != b or counts[a] > 1:
                try:
                    inputs.fits.curve(a, b)
                except SailorFormatError as e:
                    raise SailorFormatError(e.file, e.field, e.problem + needed_by) from None


def _check_tied_head(model: str, tp: int, inputs: SailorInputs, needed_by: str) -> None:
    """A tied head's logit GEMM is sized by the word embedding's rows per GPU, layer 0's
    parameters / hidden_size − sequence_length (the position embeddings): at least one."""
    shape = inputs.shapes[model]
    if not head_is_tied(inputs.sizes.get(model, 1), shape):
        return
    rows = inputs.sizes.get(model, tp).params[0] / shape.hidden_size - shape.seq_length
    if rows < 1:
        raise SailorFormatError(
            inputs.sizes.source,
            f"[{model}][{tp}][0].params_floats",
            f"{rows:.3g} word-embedding rows per GPU (params / hidden_size - sequence_length); "
            f"the tied head needs at least one{needed_by}",
        )


def _intra_source(inputs: SailorInputs) -> str:
    return str(Path(inputs.fits.source).with_name("intra_node_bandwidths.json"))
