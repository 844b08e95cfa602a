"""CLI: ``python -m system.emulation {cleanup,tc-script,check}``.

- ``cleanup [--force] [--dry-run] [--tag T]``: remove leftovers of runs whose owner is dead
  (dtfm-* namespaces, state; ``--force`` also live owners'; ``--tag`` one run's only).
- ``tc-script --case 5 --hosts hosts.txt --out DIR [--dev eth0] [--mtu 1500]
  [--bandwidth-scale S]``: per-host shaping scripts (HTB + netem per destination, window-clamped
  CUBIC routes, TCP sysctls; :mod:`system.emulation.tcscript`) for a real multi-host cluster.
- ``check --case debug [--devices 0,2,4,6] [--bandwidth-scale 0.1] [--pairs 6]``: build the
  emulated network, verify sampled links, print the table, tear it down.
- ``collectives {register,measure,posthoc,verdict} DIR``: the simulator's all-reduce algorithms
  against the runtime's (:mod:`system.emulation.collectives_check`): write ``DIR/predictions.csv``
  for ``DIR/experiment.json`` (the default experiment, written there, when absent; an existing
  registration is never rewritten); measure into ``DIR/measured.csv``
  (root); score into ``DIR/verdict.{csv,md}`` (``posthoc``: the current model's predictions
  of the registered experiment into ``DIR/posthoc.csv``, scored beside the registered ones;
  made after the measurement, they are never the registered verdict).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys

from system.cases import get_case
from system.emulation.plan import check_tag
from system.emulation.tc import MAX_MTU, MIN_MTU, check_ifname


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``error: ...``, exit 2), without the usage text."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}\n")


def _number(low: float, high: float = math.inf, *, low_open: bool = False, kind=float):
    """An argparse type: a finite ``kind`` in [low, high] (``low_open``: (low, high])."""
    what = "an integer" if kind is int else "a finite number"

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(v) or v < low or (low_open and v == low) or v > high:
            lo = f"({low:g}" if low_open else f"[{low:g}"
            hi = f"{high:g}]" if math.isfinite(high) else "inf)"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} in {lo}, {hi}")
        return v

    return parse


def _checked(check):
    """An argparse type from a checker that raises ValueError (its message on one line)."""

    def parse(text: str):
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _cluster(args):
    c = get_case(args.case, args.variant)
    if args.devices:
        try:
            devices = [int(x) for x in args.devices.split(",")]
        except ValueError:
            raise ValueError(
                f"--devices {args.devices!r}: expected device ids like 0,2,4"
            ) from None
        bad = [d for d in devices if not 0 <= d < c.num_devices]
        if bad or len(set(devices)) != len(devices):
            raise ValueError(
                f"--devices {args.devices!r}: need distinct ids in 0..{c.num_devices - 1}"
            )
        c = c.subset(devices)
    return c


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ap = _Parser(prog="python -m system.emulation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cleanup", help="remove leftovers of crashed emulation runs")
    c.add_argument("--force", action="store_true", help="also runs whose owner is still alive")
    c.add_argument("--dry-run", action="store_true")
    c.add_argument(
        "--tag", type=_checked(check_tag), default=None, help="only this emulation's leftovers"
    )
    for name in ("tc-script", "check"):
        p = sub.add_parser(name)
        p.add_argument("--case", default="debug")
        p.add_argument("--variant", default="paper")
        p.add_argument("--devices", default="", help="comma-separated device subset")
        p.add_argument("--bandwidth-scale", type=_number(0, low_open=True), default=1.0)
        p.add_argument("--delay-scale", type=_number(0), default=1.0)
        if name == "tc-script":
            p.add_argument("--hosts", required=True, help="file: one IPv4 address per host")
            p.add_argument("--out", required=True)
            p.add_argument("--dev", type=_checked(check_ifname), default="eth0")
            p.add_argument(
                "--mtu",
                type=_number(MIN_MTU, MAX_MTU, kind=int),
                default=1500,
                help=f"MTU of the hosts' links ({MIN_MTU}..{MAX_MTU})",
            )
        else:
            p.add_argument("--pairs", type=_number(1, 10_000, kind=int), default=6)
            p.add_argument("--backend", default="auto")
    s = sub.add_parser("collectives", help="the simulator's all-reduces against the runtime's")
    s.add_argument("step", choices=("register", "measure", "posthoc", "verdict"))
    s.add_argument(
        "dir", help="folder of experiment.json, predictions.csv, measured.csv, verdict.*"
    )
    args = ap.parse_args(argv)
    try:
        if args.cmd == "collectives":
            return _collectives(args.step, args.dir)
        if args.cmd == "cleanup":
            from system.emulation.cleanup import cleanup

            out = cleanup(force=args.force, dry_run=args.dry_run, tag=args.tag)
            print(json.dumps(out, indent=1))
        elif args.cmd == "tc-script":
            from system.emulation.tcscript import read_hosts, write_scripts

            paths = write_scripts(
                _cluster(args),
                read_hosts(args.hosts),
                args.out,
                dev=args.dev,
                bandwidth_scale=args.bandwidth_scale,
                delay_scale=args.delay_scale,
                mtu=args.mtu,
            )
            print("\n".join(str(p) for p in paths))
        else:
            from system.emulation.netns import Emulation
            from system.emulation.plan import make_plan
            from system.emulation.verify import verify_links

            plan = make_plan(
                _cluster(args), bandwidth_scale=args.bandwidth_scale, delay_scale=args.delay_scale
            )
            with Emulation(plan, backend=args.backend) as emu:
                rep = verify_links(plan, pairs=args.pairs, on_fail="warn")
                rep["backend"] = emu.backend
            print(f"{'pair':>7} {'RTT ms':>9} {'target':>9} {'Gbit/s':>8} {'target':>8} ok")
            for r in rep["pairs"]:
                print(
                    f"{r['src']:>3}->{r['dst']:<3} {r['rtt_ms']:9.2f} {r['target_rtt_ms']:9.2f} "
                    f"{r['gbps']:8.4f} {r['target_gbps']:8.4f} {r['ok']}"
                )
            return 0 if rep["ok"] else 1
    except (ValueError, OSError, RuntimeError) as e:  # a missing or unwritable file too
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _collectives(step: str, folder: str) -> int:
    """One step of the all-reduce experiment (module docstring)."""
    from pathlib import Path

    import pandas as pd

    from system.emulation import collectives_check as cc
    from system.results import atomic_write_text
    from system.schema import git_state

    out = Path(folder)
    sha, dirty = git_state()
    if step == "register":
        if (out / "predictions.csv").exists():
            raise ValueError(f"{out / 'predictions.csv'} exists: a registration is not rewritten")
        exp = cc.read_experiment(out) if (out / "experiment.json").exists() else None
        exp = exp or cc.CollectivesExperiment()
        pred = cc.predict(exp).assign(git_sha=sha, git_dirty=dirty)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "experiment.json", json.dumps(exp.to_json(), indent=1) + "\n")
        atomic_write_text(out / "predictions.csv", pred.to_csv(index=False))
        print(out / "predictions.csv")
        return 0
    exp, pred = cc.read_registration(out)
    if step == "measure":
        rows = [{**r, "git_sha": sha, "git_dirty": dirty} for r in cc.measure(exp, pred)]
        atomic_write_text(out / "measured.csv", pd.DataFrame(rows).to_csv(index=False))
        print(out / "measured.csv")
        return 0
    if step == "posthoc":
        post = cc.predict(exp).assign(git_sha=sha, git_dirty=dirty)
        atomic_write_text(out / "posthoc.csv", post.to_csv(index=False))
        print(out / "posthoc.csv")
        return 0
    post = cc.read_predictions(out / "posthoc.csv", exp) if (out / "posthoc.csv").exists() else None
    table = cc.verdict(pred, cc.read_measured(out / "measured.csv"), exp=exp, posthoc=post)
    atomic_write_text(out / "verdict.csv", table.to_csv(index=False, float_format="%.4g"))
    atomic_write_text(out / "verdict.md", cc.verdict_markdown(table) + "\n")
    print(cc.verdict_markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
