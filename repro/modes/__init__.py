"""One module per ``mode=`` of ``repro/run.py``; :func:`mode_options` reads a mode's own block."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

__all__ = ["mode_options"]


def mode_options(
    cfg: DictConfig, mode: str, defaults: dict, *, keep_none: tuple[str, ...] = ()
) -> dict:
    """The ``<mode>.*`` block of ``cfg`` over ``defaults``. A key not in ``defaults`` is a
    ValueError naming it; a None value means "the default" unless its key is in ``keep_none``
    (where None is itself a setting, such as "all devices").

    >>> cfg = OmegaConf.create({"emulate": {"iters": 5, "devices": None, "seed": None}})
    >>> defaults = {"iters": 3, "devices": [0, 1], "seed": 0}
    >>> mode_options(cfg, "emulate", defaults, keep_none=("devices",))
    {'iters': 5, 'devices': None, 'seed': 0}
    >>> mode_options(cfg, "emulate", {"iters": 3})
    Traceback (most recent call last):
    ValueError: mode=emulate: unknown emulate.* key(s) ['devices', 'seed']; known: ['iters']
    """
    block = cfg.get(mode)
    user = OmegaConf.to_container(block, resolve=True) if block is not None else {}
    unknown = sorted(set(user) - set(defaults))
    if unknown:
        raise ValueError(
            f"mode={mode}: unknown {mode}.* key(s) {unknown}; known: {sorted(defaults)}"
        )
    return {**defaults, **{k: v for k, v in user.items() if v is not None or k in keep_none}}
