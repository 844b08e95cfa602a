"""Train with our runtime on local processes: ``python repro/train.py model=debug pp=2 dp=2``.

Plain ``key=value`` arguments (not Hydra; workers never see Hydra). Keys are the fields of
:class:`system.runtime.spec.RunSpec` plus these shortcuts:

* ``batch=N`` — global batch in sequences (``global_batch_size``; default 8);
* ``assignment=FILE.json`` — the scheduler's output (``{"stages": [[...], ...]}``); pp and dp
  are taken from it when not given;
* ``timeout_s=S`` — wall-clock limit of the whole run (default 600);
* ``log_dir=DIR`` — keep the spec and per-rank logs;
* ``max_local_ranks=N`` — run more than 4 ranks per CPU core (the default limit, as
  ``limits.max_local_ranks`` of ``repro/run.py``).

Arguments are parsed and typed by :func:`repro.config.parse_cli` against a schema built from
RunSpec's fields, so a bad key or value is the same one-line error as in ``repro/run.py``.

Examples::

    python repro/train.py model=debug pp=2 dp=2 iters=3 seed=0 metrics_out=m.json
    python repro/train.py model=debug pp=2 dp=2 layout=random
    python repro/train.py model=debug assignment=assign.json dp_mode=allreduce

Writes the metrics JSON (``losses`` per iteration, ``iter_time_s`` per iteration and
``iter_time_median_s``, ``tokens_per_s``, ``tflops``, comm-wait and compute per rank) to
``metrics_out`` and prints a short table. Exit code 2 on bad input, with one line saying why.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import typing
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.config import ConfigError, LimitsConfig, parse_cli  # noqa: E402
from system.runtime.spec import RunSpec  # noqa: E402

log = logging.getLogger("repro.train")

__all__ = ["TrainArgs", "spec_from_args", "main"]

_ALIASES = {"batch": "global_batch_size", "trace": "trace_path"}


def _schema() -> type:
    hints = typing.get_type_hints(RunSpec)
    specs = []
    for f in dataclasses.fields(RunSpec):
        if f.name in ("stages", "extra"):
            continue
        specs.append((f.name, hints[f.name], dataclasses.field(default=f.default)))
    specs += [
        ("batch", int | None, dataclasses.field(default=None)),
        ("trace", str | None, dataclasses.field(default=None)),
        ("assignment", str | None, dataclasses.field(default=None)),
        ("timeout_s", float, dataclasses.field(default=600.0)),
        ("log_dir", str | None, dataclasses.field(default=None)),
        ("max_local_ranks", int | None, dataclasses.field(default=None)),
    ]
    return dataclasses.make_dataclass("TrainArgs", specs)


TrainArgs = _schema()


def spec_from_args(args: list[str]) -> tuple[RunSpec, dict]:
    """``key=value`` strings -> (RunSpec, launch options). Raises ConfigError on a bad key/value."""
    parsed = parse_cli(TrainArgs, args)
    given = {a.split("=", 1)[0] for a in args if "=" in a}
    values = {
        f.name: getattr(parsed, f.name) for f in dataclasses.fields(RunSpec) if f.name in given
    }
    for alias, name in _ALIASES.items():
        if alias in given:
            values[name] = getattr(parsed, alias)
    launch_opts = {"timeout_s": parsed.timeout_s}
    if parsed.log_dir is not None:
        launch_opts["log_dir"] = parsed.log_dir
    if parsed.assignment is not None:
        from system.assignment import Assignment

        try:
            a = Assignment.load(parsed.assignment)
        except (ValueError, KeyError, OSError) as e:
            raise ConfigError(f"assignment={parsed.assignment!r}: {e}") from None
        values["stages"] = a.stages.tolist()
        values.setdefault("pp", a.pp)
        values.setdefault("dp", a.dp)
    spec = RunSpec(**values)
    LimitsConfig(max_local_ranks=parsed.max_local_ranks).check_ranks(
        spec.world_size, f"pp*dp = {spec.pp}*{spec.dp}", key="max_local_ranks"
    )
    LimitsConfig().check_micro_batches(spec.global_batch_size, spec.micro_batch_size)
    return spec, launch_opts


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
