"""Train with our runtime on local processes: ``python repro/train.py model=debug pp=2 dp=2``.

Plain ``key=value`` arguments (not Hydra; workers never see Hydra). Keys are the fields of
:class:`system.runtime.spec.RunSpec` plus these shortcuts:

* ``batch=N`` — global batch in sequences (``global_batch_size``; default 8);
* ``assignment=FILE.json`` — the scheduler's output (``{"stages": [[...], ...]}``); pp and dp
  are taken from it when not given;
* ``timeout_s=S`` — wall-clock limit of the whole run (default 600);
* ``log_dir=DIR`` — keep the spec and per-rank logs.

Examples::

    python repro/train.py model=debug pp=2 dp=2 iters=3 seed=0 metrics_out=m.json
    python repro/train.py model=debug pp=2 dp=2 layout=random
    python repro/train.py model=debug assignment=assign.json dp_mode=allreduce

Writes the metrics JSON (``losses`` per iteration, ``iter_time_s`` per iteration and
``iter_time_median_s``, ``tokens_per_s``, ``tflops``, comm-wait and compute per rank) to
``metrics_out`` and prints a short table. Exit code 2 on bad input, with one line saying why.
"""

from __future__ import annotations

import logging
import sys
import typing
from dataclasses import fields
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from system.runtime.spec import RunSpec  # noqa: E402

log = logging.getLogger("repro.train")

__all__ = ["spec_from_args", "main"]

_ALIASES = {"batch": "global_batch_size", "trace": "trace_path"}
_LAUNCH_KEYS = {"timeout_s": float, "log_dir": str}


def _convert(name: str, text: str, typ) -> object:
    """Parse ``text`` as the RunSpec field type ``typ`` (a type-hint string)."""
    t = str(typ)
    if text.lower() in ("null", "none") and "None" in t:
        return None
    try:
        if t.startswith("bool"):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if t.startswith("int"):
            return int(text)
        if t.startswith("float"):
            return float(text)
    except ValueError:
        raise ValueError(f"argument {name}={text!r}: expected {t}") from None
    return text


def spec_from_args(args: list[str]) -> tuple[RunSpec, dict]:
    """``key=value`` strings -> (RunSpec, launch options). Raises ValueError on a bad key/value."""
    hints = typing.get_type_hints(RunSpec)
    known = {f.name for f in fields(RunSpec)} - {"stages", "extra"}
    values: dict = {"global_batch_size": 8}
    launch_opts: dict = {}
    assignment = None
    for a in args:
        if "=" not in a:
            raise ValueError(f"argument {a!r} is not key=value")
        key, text = a.split("=", 1)
        key = _ALIASES.get(key, key)
        if key == "assignment":
            assignment = text
        elif key in _LAUNCH_KEYS:
            launch_opts[key] = _LAUNCH_KEYS[key](text)
        elif key in known:
            values[key] = _convert(
                key, text, hints[key].__name__ if isinstance(hints[key], type) else hints[key]
            )
        else:
            raise ValueError(
                f"unknown argument {key!r}; known: "
                f"{sorted(known | {'batch', 'assignment', 'timeout_s', 'log_dir'})}"
            )
    if assignment is not None:
        from system.assignment import Assignment

        a = Assignment.load(assignment)
        values["stages"] = a.stages.tolist()
        values.setdefault("pp", a.pp)
        values.setdefault("dp", a.dp)
    return RunSpec(**values), launch_opts


def main(argv: list[str] | None = None) -> int:
    from repro.console import console, setup_logging
    from system.runtime.launch import launch

    setup_logging()
    try:
        spec, opts = spec_from_args(sys.argv[1:] if argv is None else argv)
        metrics = launch(spec, **opts)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        log.error("%s", e)
        sys.stderr.write(f"error: {e}\n")
        return 2
    out = console()
    out.print(f"pp={spec.pp} dp={spec.dp} layout={metrics['stages']} dp_mode={spec.dp_mode}")
    for i, (loss, t) in enumerate(zip(metrics["losses"], metrics["iter_time_s"], strict=True)):
        out.print(f"step {i} | loss {loss:.5f} | iter {t:.4f} s")
    out.print(
        f"median iter {metrics['iter_time_median_s']:.4f} s | {metrics['tokens_per_s']:.0f} "
        f"tokens/s | {metrics['tflops']:.4f} TFLOPS | compute {metrics['compute_s_median']:.4f}"
        f" s | wait {metrics['wait_s_median']:.4f} s | dp {metrics['dp_s_median']:.4f} s"
    )
    if spec.metrics_out:
        out.print(f"metrics: {spec.metrics_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
