"""Running ``ip``/``tc``/``iptables`` inside namespaces, bounded in time, with one clear error.

Every command that changes network state goes through :func:`run_cmd` or :func:`run_batch`, so a
dry run can record the commands instead of executing them (the tc-script tests use that).
Commands are argument lists (never a shell), and a namespace name is checked against
:data:`NS_NAME` before it reaches one (``ip netns`` turns it into a path under /run/netns).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

log = logging.getLogger(__name__)

__all__ = [
    "run_cmd",
    "run_batch",
    "ns_prefix",
    "check_ns_name",
    "missing_tools",
    "netns_list",
    "EmulationError",
    "NS_NAME",
]

NS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # no '/', '.', space or quote


class EmulationError(RuntimeError):
    """A network-emulation command failed (message names the command and its stderr)."""


def check_ns_name(ns: str) -> str:
    """``ns`` if it is a plain namespace name (:data:`NS_NAME`), else ValueError."""
    if not isinstance(ns, str) or not NS_NAME.fullmatch(ns):
        raise ValueError(f"network namespace name {ns!r} is not a plain name ({NS_NAME.pattern})")
    return ns


def ns_prefix(ns: str | None) -> list[str]:
    return [] if ns is None else ["ip", "netns", "exec", check_ns_name(ns)]


def run_cmd(
    args: Sequence[str],
    *,
    ns: str | None = None,
    timeout_s: float = 15.0,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``args`` (inside namespace ``ns`` when given); raise EmulationError on failure."""
    full = ns_prefix(ns) + list(args)
    try:
        p = subprocess.run(
            full,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired as e:
        raise EmulationError(f"command timed out after {timeout_s:.0f} s: {' '.join(full)}") from e
    if check and p.returncode != 0:
        raise EmulationError(
            f"command failed ({p.returncode}): {' '.join(full)}: "
            f"{(p.stderr or p.stdout).strip()[:500]}"
        )
    return p


def run_batch(
    tool: str, lines: Sequence[str], *, ns: str | None = None, timeout_s: float = 30.0
) -> None:
    """Feed ``lines`` to ``tool -batch -`` (tool is ``ip`` or ``tc``) in one process."""
    if tool not in ("ip", "tc"):
        raise ValueError(f"run_batch: tool must be 'ip' or 'tc', got {tool!r}")
    if not lines:
        return
    run_cmd([tool, "-batch", "-"], ns=ns, timeout_s=timeout_s, input_text="\n".join(lines) + "\n")


def missing_tools(tools: Sequence[str] = ("ip", "tc", "iptables")) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def netns_list() -> list[str]:
    """Names of all network namespaces (``ip netns list``), first word of each line."""
    p = run_cmd(["ip", "netns", "list"], check=False, timeout_s=10)
    return [ln.split()[0] for ln in p.stdout.splitlines() if ln.strip()]
