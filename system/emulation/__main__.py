"""The emulation tools' CLI: ``python -m system.emulation {cleanup,tc-script,check}``.

The emulation's experiments are modes of ``python repro/run.py`` (``mode=emulate``,
``mode=link_sharing``, ``mode=collectives``); this CLI holds only the tools around them.

- ``cleanup [--force] [--dry-run] [--tag T]``: remove leftovers of runs whose owner is dead
  (dtfm-* namespaces, state; ``--force`` also live owners'; ``--tag`` one run's only).
- ``tc-script --case 5 --hosts hosts.txt --out DIR [--dev eth0] [--mtu 1500]
  [--bandwidth-scale S]``: per-host shaping scripts (HTB + netem per destination, window-clamped
  CUBIC routes, TCP sysctls; :mod:`system.emulation.tcscript`) for a real multi-host cluster.
- ``check --case debug [--devices 0,2,4,6] [--bandwidth-scale 0.1] [--pairs 6]``: build the
  emulated network, verify sampled links, print the table, tear it down.
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
    args = ap.parse_args(argv)
    try:
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


if __name__ == "__main__":
    sys.exit(main())
