"""The methods of the time-to-quality study and the hyperparameters each may try.

Each method's setting is a :class:`~system.compression.Compression` and a learning rate, the
:class:`~system.runtime.spec.RunSpec` options ``compression`` and ``lr`` (the runtime runs the
same options on emulated links, and the simulator prices them at paper scale). Every method gets the
same budget: :data:`TRIALS` settings tried on the validation split before any scored seed. The
reference (synchronous data parallelism, no compression) tries three learning rates; each other
method then tries three settings of its own knobs around the reference's chosen rate ``lr*``
(written as a multiple of it), so every method has its learning rate in its search.

* ``ours`` — the reference: AdamW, the gradients averaged exactly each step (the scheduled
  layout's arithmetic; Megatron and DeepSpeed run the same arithmetic);
* ``pipe_q`` — activations across pipeline boundaries quantized (forward/backward bits);
* ``aq_sgd`` — AQ-SGD (Wang et al., NeurIPS 2022): per-sample activation changes quantized;
* ``dp_topk`` — top-k of each gradient shard with quantized values and error feedback inside
  the sharded exchange (CocktailSGD-style, Wang et al., ICML 2023), k as a fraction of a shard;
* ``diloco_h4`` / ``_h16`` / ``_h64`` — DiLoCo (Douillard et al., 2023) with H inner AdamW
  steps, outer Nesterov SGD; its paper's outer rate 0.7 and momentum 0.9 is one of the three.

A run's row names its setting in ``hparams``, JSON of :func:`hparams_text`: ``lr`` and, when
any is on, ``compression`` in :meth:`Compression.to_dict`'s nested form (its active parts);
:func:`setting_of` reads it back.
"""

from __future__ import annotations

import json

from repro.studies.quality_curves.config import METHODS as CONFIG_METHODS
from system.compression import Compression, DPCompression, LocalSGD, PipeCompression

__all__ = ["REFERENCE", "TRIALS", "REFERENCE_LRS", "GRIDS", "METHODS"]
__all__ += ["trials", "hparams_text", "setting_of"]

REFERENCE = CONFIG_METHODS[0]
TRIALS = 3

# the reference's learning rates (AdamW peak rate of the cosine schedule)
REFERENCE_LRS = (1.5e-3, 3e-3, 6e-3)


def _pipe(method: str, bwd_bits: int) -> Compression:
    return Compression(pipe=PipeCompression(method=method, fwd_bits=4, bwd_bits=bwd_bits))


def _topk(ratio: float) -> Compression:
    return Compression(dp=DPCompression(method="topk", ratio=ratio, bits=8))


def _diloco(h: int, outer_lr: float) -> Compression:
    return Compression(
        local=LocalSGD(method="diloco", inner_steps=h, outer_lr=outer_lr, outer_momentum=0.9)
    )


# per method: the settings tried, each (its options, its learning rate as a multiple of lr*)
GRIDS: dict[str, list[tuple[Compression, float]]] = {
    "pipe_q": [
        (_pipe("quantize", bwd_bits=8), 1.0),
        (_pipe("quantize", bwd_bits=4), 1.0),
        (_pipe("quantize", bwd_bits=8), 0.5),
    ],
    "aq_sgd": [
        (_pipe("aq_sgd", bwd_bits=8), 1.0),
        (_pipe("aq_sgd", bwd_bits=4), 1.0),
        (_pipe("aq_sgd", bwd_bits=8), 0.5),
    ],
    "dp_topk": [(_topk(0.05), 1.0), (_topk(0.01), 1.0), (_topk(0.05), 0.5)],
    **{
        f"diloco_h{h}": [(_diloco(h, 0.7), 1.0), (_diloco(h, 0.4), 1.0), (_diloco(h, 0.7), 0.5)]
        for h in (4, 16, 64)
    },
}
METHODS = (REFERENCE, *GRIDS)
assert METHODS == CONFIG_METHODS, "the config's method names and the grids disagree"
assert all(len(g) == TRIALS for g in GRIDS.values()) and len(REFERENCE_LRS) == TRIALS


def trials(method: str, lr_star: float | None) -> list[dict]:
    """The settings ``method`` tries: RunSpec options ``lr`` and (but the reference's)
    ``compression``."""
    if method == REFERENCE:
        return [dict(lr=lr) for lr in REFERENCE_LRS]
    if lr_star is None:
        raise ValueError(f"trials: {method} needs the reference's chosen rate first")
    return [dict(lr=lr_star * scale, compression=c) for c, scale in GRIDS[method]]


def hparams_text(setting: dict) -> str:
    """A setting's ``hparams`` column: ``lr``, and ``compression``'s active parts when any."""
    compression = setting.get("compression", Compression())
    extra = sorted(set(setting) - {"lr", "compression"})
    if extra:
        raise ValueError(f"hparams_text: unknown option(s) {extra}; a setting is lr, compression")
    out = {"lr": setting["lr"]}
    if compression.active:
        out["compression"] = compression.to_dict(only_active=True)
    return json.dumps(out, sort_keys=True)


# Rows stored before RunSpec held its options as one ``compression`` wrote a setting with the
# flat RunSpec field names of that time; each is read as its part of the nested form.
_STORED_FLAT = {
    "pipe_compress": ("pipe", "method"),
    "pipe_fwd_bits": ("pipe", "fwd_bits"),
    "pipe_bwd_bits": ("pipe", "bwd_bits"),
    "dp_compress": ("dp", "method"),
    "dp_ratio": ("dp", "ratio"),
    "dp_bits": ("dp", "bits"),
    "local_sgd": ("local", "method"),
    "diloco_inner_steps": ("local", "inner_steps"),
    "diloco_outer_lr": ("local", "outer_lr"),
    "diloco_outer_momentum": ("local", "outer_momentum"),
}


def setting_of(hparams: str) -> dict:
    """A row's ``hparams`` back as the setting :func:`hparams_text` wrote (``lr``, and
    ``compression`` when any is on); a row stored with the flat names of
    :data:`_STORED_FLAT` reads as the same setting."""
    h = json.loads(hparams)
    if not isinstance(h, dict) or "lr" not in h:
        raise ValueError(f"hparams {hparams!r}: a JSON object with lr")
    nested = h.pop("compression", {})
    for name in sorted(set(h) - {"lr"}):
        if name not in _STORED_FLAT:
            raise ValueError(f"hparams {hparams!r}: unknown option {name!r}")
        part, field = _STORED_FLAT[name]
        nested.setdefault(part, {})[field] = h.pop(name)
    compression = Compression.from_dict(nested, where=f"hparams {hparams!r}")
    return {"lr": h["lr"], **({"compression": compression} if compression.active else {})}
