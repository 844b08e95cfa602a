"""Importers of Sailor's model files: per-layer time profiles, per-layer sizes, model shapes.

- ``profiles_tmp.json``: ``{model: {gpu: {mbs: {tp: {layer: [fwd_s, bwd_s, opt_step_s]}}}}}``,
  seconds per micro-batch of ``mbs`` sequences at tensor-parallel degree ``tp`` (the TP
  collectives are inside fwd/bwd). ``opt_step_s`` is the optimizer step of the whole *profiled*
  model, repeated on every layer: Sailor's profiler (its ``profile.sh``) runs the model with
  ``--num-layers 2``, so that model is the embedding, two transformer layers and the last layer.
- ``llm_info.json``: ``{model: {tp: {layer: {params_floats, act_output_floats, act_mem_floats,
  ...}}}}``, per GPU at that TP degree and per sequence (micro-batch 1).
- ``training_config_*.json``: the model's shape (hidden, sequence, layers, vocabulary).

Layer ids must be 0..L−1, each once, with L the model's ``num_all_layers`` (embedding, L−2
transformer blocks, the final norm + head + loss). Every time is finite and >= 0 (the shared
profiles hold a few zeros in rows no plan uses; :mod:`~system.external.sailor.check` asks more of
the rows a plan uses), every size finite and > 0, every shape a whole number in 1..2³¹−1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from system.external.sailor.errors import SailorFormatError, number, positive_int, read_json
from system.external.sailor.gpus import project_gpu

__all__ = [
    "ModelShape",
    "LayerTimes",
    "Profiles",
    "LayerSizes",
    "ModelSizes",
    "load_training_config",
    "load_profiles",
    "load_llm_info",
    "read_json",
]

PROFILED_TRANSFORMER_LAYERS = 2  # Sailor's profile.sh: --num_prof_layers 2
MAX_SHAPE = 2**31 - 1  # Megatron's arguments are int32; larger shapes overflow the FLOP counts
MAX_LAYER_S = 86_400.0  # one layer's micro-batch longer than a day is no measurement
MAX_ELEMENTS = 1e15  # one layer of 4 PB in fp32 is no model of this data set


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A model's shape from its training config (Sailor's name in ``name``)."""

    name: str
    hidden_size: int
    seq_length: int
    num_layers: int  # transformer blocks
    num_all_layers: int  # + embedding + final layer
    vocab_size: int
    heads: int


def load_training_config(path) -> ModelShape:
    d = read_json(path)

    def get(key):
        if key not in d:
            raise SailorFormatError(path, key, "missing")
        v = positive_int(d[key], path, key)
        if v > MAX_SHAPE:
            raise SailorFormatError(path, key, f"{float(v):.3g} is over {MAX_SHAPE}")
        return v

    name = d.get("model")
    if not isinstance(name, str) or not name:
        raise SailorFormatError(path, "model", f"expected a model name, got {name!r}")
    shape = ModelShape(
        name=name,
        hidden_size=get("hidden_size"),
        seq_length=get("sequence_length"),
        num_layers=get("num_layers"),
        num_all_layers=get("num_all_layers"),
        vocab_size=get("vocab_size"),
        heads=get("heads"),
    )
    if shape.num_all_layers != shape.num_layers + 2:
        raise SailorFormatError(
            path, "num_all_layers", f"expected num_layers + 2 = {shape.num_layers + 2}"
        )
    return shape


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One profile row: per-layer forward and backward seconds per micro-batch, and the
    optimizer step of the profiled model (seconds)."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    profiled_opt_s: float

    @property
    def num_layers(self) -> int:
        return int(self.fwd_s.size)


@dataclass(frozen=True, slots=True)
class Profiles:
    """Rows by ``(model, Sailor gpu, mbs, tp)``."""

    source: str
    rows: dict[tuple[str, str, int, int], LayerTimes] = field(repr=False)

    def get(self, model: str, gpu: str, mbs: int, tp: int, *, where: str = "") -> LayerTimes:
        key = (model, gpu, int(mbs), int(tp))
        if key not in self.rows:
            raise SailorFormatError(
                self.source,
                f"[{model}][{gpu}][{mbs}][{tp}]",
                f"no profile for this model, GPU, micro-batch size and TP degree{where}",
            )
        return self.rows[key]


def _layer_ids(keys, file, where: str) -> list[int]:
    ids = []
    for k in keys:
        try:
            ids.append(int(k))
        except ValueError:
            raise SailorFormatError(file, f"{where}[{k}]", "layer id is not an integer") from None
    if sorted(ids) != list(range(len(ids))):
        missing = sorted(set(range(max(ids) + 1)) - set(ids)) if ids else [0]
        raise SailorFormatError(
            file, where, f"layer ids must be 0..{len(ids) - 1}; missing {missing[:5]}"
        )
    return ids


def load_profiles(path) -> Profiles:
    """Every row of ``profiles_tmp.json``, each value checked (finite, >= 0)."""
    data = read_json(path)
    rows = {}
    for model, by_gpu in data.items():
        if not isinstance(by_gpu, dict):
            raise SailorFormatError(path, f"[{model}]", "expected an object of GPU types")
        for gpu, by_mbs in by_gpu.items():
            project_gpu(gpu, path, f"[{model}][{gpu}]")
            for mbs, by_tp in _obj(by_mbs, path, f"[{model}][{gpu}]").items():
                b = _int(mbs, path, f"[{model}][{gpu}][{mbs}]")
                for tp, layers in _obj(by_tp, path, f"[{model}][{gpu}][{mbs}]").items():
                    t = _int(tp, path, f"[{model}][{gpu}][{mbs}][{tp}]")
                    where = f"[{model}][{gpu}][{mbs}][{tp}]"
                    layers = _obj(layers, path, where)
                    ids = _layer_ids(layers.keys(), path, where)
                    f = np.zeros(len(ids))
                    bw = np.zeros(len(ids))
                    opt = []
                    for k in ids:
                        v = layers[str(k)]
                        w = f"{where}[{k}]"
                        if not isinstance(v, list) or len(v) != 3:
                            raise SailorFormatError(path, w, "expected [fwd_s, bwd_s, opt_s]")
                        f[k] = _time(v[0], path, f"{w}[0] (fwd_s)")
                        bw[k] = _time(v[1], path, f"{w}[1] (bwd_s)")
                        opt.append(_time(v[2], path, f"{w}[2] (opt_s)"))
                    f.setflags(write=False)
                    bw.setflags(write=False)
                    rows[(model, gpu, b, t)] = LayerTimes(f, bw, float(max(opt)))
    return Profiles(source=str(path), rows=rows)


def _time(value, file, field: str) -> float:
    """A profiled time: finite, in [0, MAX_LAYER_S] seconds."""
    x = number(value, file, field)
    if x > MAX_LAYER_S:
        raise SailorFormatError(file, field, f"{value!r} s is over {MAX_LAYER_S:g} s")
    return x


def _obj(d, file, where: str) -> dict:
    if not isinstance(d, dict) or not d:
        raise SailorFormatError(file, where, "expected a non-empty JSON object")
    return d


def _int(key, file, where: str) -> int:
    try:
        return positive_int(int(key), file, where)
    except ValueError:
        raise SailorFormatError(file, where, f"expected a positive integer, got {key!r}") from None


@dataclass(frozen=True, slots=True)
class LayerSizes:
    """Per-layer sizes at one TP degree, per GPU and per sequence (element counts)."""

    params: np.ndarray  # parameters held per GPU
    act_output: np.ndarray  # elements of the layer's output (what a stage boundary sends)
    act_mem: np.ndarray  # elements kept for the backward pass

    @property
    def num_layers(self) -> int:
        return int(self.params.size)


@dataclass(frozen=True, slots=True)
class ModelSizes:
    """``llm_info.json`` rows by ``(model, tp)``."""

    source: str
    rows: dict[tuple[str, int], LayerSizes] = field(repr=False)

    def get(self, model: str, tp: int) -> LayerSizes:
        if (model, int(tp)) not in self.rows:
            raise SailorFormatError(self.source, f"[{model}][{tp}]", "no sizes for this model/TP")
        return self.rows[(model, int(tp))]


def _size(value, file, field: str) -> float:
    """An element count: finite, > 0 (every layer holds parameters and outputs), at most
    MAX_ELEMENTS."""
    x = number(value, file, field)
    if not 0 < x <= MAX_ELEMENTS:
        raise SailorFormatError(file, field, f"{value!r} is outside (0, {MAX_ELEMENTS:g}]")
    return x


def load_llm_info(path) -> ModelSizes:
    data = read_json(path)
    rows = {}
    for model, by_tp in data.items():
        for tp, layers in _obj(by_tp, path, f"[{model}]").items():
            t = _int(tp, path, f"[{model}][{tp}]")
            where = f"[{model}][{tp}]"
            layers = _obj(layers, path, where)
            ids = _layer_ids(layers.keys(), path, where)
            cols = {k: np.zeros(len(ids)) for k in ("params_floats", "act_output_floats")}
            cols["act_mem_floats"] = np.zeros(len(ids))
            for k in ids:
                v = _obj(layers[str(k)], path, f"{where}[{k}]")
                for key, arr in cols.items():
                    if key not in v:
                        raise SailorFormatError(path, f"{where}[{k}].{key}", "missing")
                    arr[k] = _size(v[key], path, f"{where}[{k}].{key}")
            rows[(model, t)] = LayerSizes(
                cols["params_floats"], cols["act_output_floats"], cols["act_mem_floats"]
            )
    return ModelSizes(source=str(path), rows=rows)
