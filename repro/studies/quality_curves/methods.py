"""The methods of the time-to-quality study and the hyperparameters each may try.

Each method is a set of :class:`~system.runtime.spec.RunSpec` options (the runtime runs the same
options on emulated links, and the simulator prices them at paper scale). Every method gets the
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
"""

from __future__ import annotations

from repro.studies.quality_curves.config import METHODS as CONFIG_METHODS

REFERENCE = CONFIG_METHODS[0]
TRIALS = 3

# the reference's learning rates (AdamW peak rate of the cosine schedule)
REFERENCE_LRS = (1.5e-3, 3e-3, 6e-3)


def _diloco(h: int) -> list[dict]:
    base = dict(local_sgd="diloco", diloco_inner_steps=h)
    return [
        dict(base, diloco_outer_lr=0.7, diloco_outer_momentum=0.9, lr_scale=1.0),
        dict(base, diloco_outer_lr=0.4, diloco_outer_momentum=0.9, lr_scale=1.0),
        dict(base, diloco_outer_lr=0.7, diloco_outer_momentum=0.9, lr_scale=0.5),
    ]


# per method: the settings tried, each RunSpec options plus ``lr_scale`` (× lr*)
GRIDS: dict[str, list[dict]] = {
    "pipe_q": [
        dict(pipe_compress="quantize", pipe_fwd_bits=4, pipe_bwd_bits=8, lr_scale=1.0),
        dict(pipe_compress="quantize", pipe_fwd_bits=4, pipe_bwd_bits=4, lr_scale=1.0),
        dict(pipe_compress="quantize", pipe_fwd_bits=4, pipe_bwd_bits=8, lr_scale=0.5),
    ],
    "aq_sgd": [
        dict(pipe_compress="aq_sgd", pipe_fwd_bits=4, pipe_bwd_bits=8, lr_scale=1.0),
        dict(pipe_compress="aq_sgd", pipe_fwd_bits=4, pipe_bwd_bits=4, lr_scale=1.0),
        dict(pipe_compress="aq_sgd", pipe_fwd_bits=4, pipe_bwd_bits=8, lr_scale=0.5),
    ],
    "dp_topk": [
        dict(dp_compress="topk", dp_ratio=0.05, dp_bits=8, lr_scale=1.0),
        dict(dp_compress="topk", dp_ratio=0.01, dp_bits=8, lr_scale=1.0),
        dict(dp_compress="topk", dp_ratio=0.05, dp_bits=8, lr_scale=0.5),
    ],
    "diloco_h4": _diloco(4),
    "diloco_h16": _diloco(16),
    "diloco_h64": _diloco(64),
}
METHODS = (REFERENCE, *GRIDS)
assert METHODS == CONFIG_METHODS, "the config's method names and the grids disagree"
assert all(len(g) == TRIALS for g in GRIDS.values()) and len(REFERENCE_LRS) == TRIALS


def trials(method: str, lr_star: float | None) -> list[dict]:
    """The settings ``method`` tries: RunSpec options with ``lr`` filled in."""
    if method == REFERENCE:
        return [dict(lr=lr) for lr in REFERENCE_LRS]
    if lr_star is None:
        raise ValueError(f"trials: {method} needs the reference's chosen rate first")
    out = []
    for g in GRIDS[method]:
        g = dict(g)
        scale = g.pop("lr_scale")
        out.append(dict(g, lr=lr_star * scale))
    return out
