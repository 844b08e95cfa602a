"""Remove leftovers of crashed emulation runs: ``python -m system.emulation cleanup``.

Everything an :class:`~system.emulation.netns.Emulation` creates lives in namespaces named
``dtfm-*`` (qdiscs, iptables rules, veths and the bridge disappear with their namespace) plus a
state folder ``<tmp>/dtfm-<tag>/``. A run whose owner process is still alive is left alone
unless ``force``; namespaces without a state folder are leftovers. ``prefix`` narrows both to
tags that start with it: a driver or a test that owns a tag prefix cleans up after an earlier
killed run of its own without touching anyone else's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from system.emulation.netns import STATE_ROOT, _kill_netns_pids
from system.emulation.plan import PREFIX
from system.emulation.shell import EmulationError, netns_list, run_cmd

log = logging.getLogger(__name__)

__all__ = ["leftovers", "cleanup"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_namespaces() -> set[str]:
    """Namespaces that belong to an emulation whose owner process still runs."""
    live: set[str] = set()
    for d in STATE_ROOT.glob(f"{PREFIX}*"):
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(st.get("owner_pid", -1))) and int(st.get("owner_pid", -1)) != os.getpid():
            live.update(st.get("namespaces", []))
    return live


def leftovers(*, force: bool = False, prefix: str = "") -> list[str]:
    """``dtfm-<prefix>*`` namespaces that cleanup would remove."""
    live = set() if force else _live_namespaces()
    return [ns for ns in netns_list() if ns.startswith(PREFIX + prefix) and ns not in live]


def cleanup(*, force: bool = False, dry_run: bool = False, prefix: str = "") -> dict:
    """Kill processes in leftover namespaces, delete them and stale state folders (only tags
    starting with ``prefix`` when given)."""
    if os.geteuid() != 0 and not dry_run:
        raise EmulationError("cleanup needs root")
    gone = leftovers(force=force, prefix=prefix)
    live = set() if force else _live_namespaces()
    dirs = []
    for d in STATE_ROOT.glob(f"{PREFIX}{prefix}*"):
        # Only an emulation's own state folder (it holds state.json): other tools keep folders
        # under the same prefix (the runtime's run logs, the single-node Slurm's state).
        if not (d / "state.json").is_file():
            continue
        try:
            st = json.loads((d / "state.json").read_text())
            owned = set(st.get("namespaces", []))
        except (OSError, ValueError):
            owned = set()
        if not (owned & live):
            dirs.append(d)
    if not dry_run:
        for ns in gone:
            _kill_netns_pids(ns)
            run_cmd(["ip", "netns", "del", ns], check=False)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    log.info(
        "cleanup: %s %d namespaces, %d state folders",
        "would remove" if dry_run else "removed",
        len(gone),
        len(dirs),
    )
    return {"namespaces": gone, "state_dirs": [str(Path(d)) for d in dirs], "dry_run": dry_run}
