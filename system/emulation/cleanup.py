"""Who owns which emulated network, and the removal of what a dead owner left behind.

Everything an :class:`~system.emulation.netns.Emulation` creates lives in namespaces named
``dtfm-<tag>-*`` (qdiscs, iptables rules, veths and the bridge disappear with their namespace)
plus a state folder ``<tmp>/dtfm-<tag>/`` whose ``state.json`` names its owner (pid and start
time, so a reused pid is not mistaken for the owner) and its namespaces. It is written before
the first namespace is created.

An owner's leftovers are removed three ways, none of which touches a live owner's network:

* by the owner itself on any exit it survives (``Emulation.close``: errors, Ctrl-C, SIGTERM,
  SIGHUP, interpreter exit);
* by its guard process right after the owner dies, SIGKILL included (:mod:`system.lifeline`
  runs ``python -m system.emulation cleanup --tag <tag>``);
* by the next emulation on the machine, which removes every dead owner's leftovers before it
  builds its own and logs what it removed (:func:`reap_dead`), and by ``python -m
  system.emulation cleanup`` by hand.

A ``dtfm-*`` namespace that no state file names is removed once it is older than
:data:`ORPHAN_AGE_S` (younger, it may be a run's probe between two of its steps); ``force``
removes live owners' networks too. ``prefix`` or ``tag`` narrow every removal to tags that start
with the prefix, or to one tag.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from system.emulation.plan import PREFIX
from system.emulation.shell import NS_NAME, EmulationError, netns_list, run_cmd
from system.lifeline import pid_alive, process_start_time

log = logging.getLogger(__name__)

__all__ = [
    "STATE_ROOT",
    "ORPHAN_AGE_S",
    "Owner",
    "write_state",
    "owners",
    "leftovers",
    "cleanup",
    "reap_dead",
    "kill_netns_pids",
]

STATE_ROOT = Path(tempfile.gettempdir())  # run state lives in <tmp>/dtfm-<tag>/
NETNS_DIR = Path("/run/netns")  # where ip-netns keeps a namespace's handle
ORPHAN_AGE_S = 60.0


@dataclass(frozen=True)
class Owner:
    """One emulation's state file: its tag, folder, namespaces and whether its owner lives."""

    tag: str
    state_dir: Path
    namespaces: tuple[str, ...]
    pid: int
    alive: bool


def write_state(state_dir: Path, *, tag: str, namespaces: list[str], backend: str | None) -> None:
    """Record this process as the owner of ``tag``'s namespaces (before creating any)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "owner_pid": os.getpid(),
        "owner_start": process_start_time(os.getpid()),
        "tag": tag,
        "namespaces": list(namespaces),
        "backend": backend,
    }
    tmp = state_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(state_dir / "state.json")


def _owner_alive(state: dict) -> bool:
    pid = int(state.get("owner_pid", -1))
    if pid <= 0 or not pid_alive(pid):
        return False
    start = state.get("owner_start")
    return start is None or process_start_time(pid) == int(start)


def owners(prefix: str = "") -> list[Owner]:
    """Every emulation state folder under :data:`STATE_ROOT` with tags starting with ``prefix``
    (folders without a readable ``state.json`` are another tool's: the runtime's run logs,
    the single-node Slurm's state)."""
    out = []
    for d in sorted(STATE_ROOT.glob(f"{PREFIX}{prefix}*")):
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(st, dict):
            continue
        tag = str(st.get("tag") or d.name[len(PREFIX) :])
        namespaces = tuple(str(n) for n in st.get("namespaces", []) if isinstance(n, str))
        out.append(Owner(tag, d, namespaces, int(st.get("owner_pid", -1)), _owner_alive(st)))
    return out


def _age_s(ns: str) -> float:
    try:
        return time.time() - (NETNS_DIR / ns).stat().st_mtime
    except OSError:
        return float("inf")


def _matches(ns: str, prefix: str, tag: str | None) -> bool:
    if tag is not None:
        return ns.startswith(f"{PREFIX}{tag}-")
    return ns.startswith(PREFIX + prefix)


def leftovers(*, force: bool = False, prefix: str = "", tag: str | None = None) -> list[str]:
    """``dtfm-*`` namespaces that :func:`cleanup` would remove: a dead owner's, or no owner's
    and older than :data:`ORPHAN_AGE_S` (``force``: every one)."""
    known = owners()
    live = {ns for o in known if o.alive and o.pid != os.getpid() for ns in o.namespaces}
    named = {ns for o in known for ns in o.namespaces}
    out = []
    for ns in netns_list():
        if not _matches(ns, prefix, tag) or not NS_NAME.fullmatch(ns):
            continue
        if (
            force
            or (ns in named and ns not in live)
            or (ns not in named and _age_s(ns) > ORPHAN_AGE_S)
        ):
            out.append(ns)
    return out


def kill_netns_pids(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns``."""
    p = run_cmd(["ip", "netns", "pids", ns], check=False, timeout_s=10)
    for tok in p.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def cleanup(
    *, force: bool = False, dry_run: bool = False, prefix: str = "", tag: str | None = None
) -> dict:
    """Kill processes in :func:`leftovers`, delete them and their owners' state folders."""
    if os.geteuid() != 0 and not dry_run:
        raise EmulationError("cleanup needs root")
    gone = leftovers(force=force, prefix=prefix, tag=tag)
    dirs = [
        o.state_dir
        for o in owners(prefix if tag is None else tag)
        if (tag is None or o.tag == tag) and (force or not o.alive) and o.pid != os.getpid()
    ]
    if not dry_run:
        for ns in gone:
            kill_netns_pids(ns)
            run_cmd(["ip", "netns", "del", ns], check=False)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    log.info(
        "cleanup: %s %d namespaces, %d state folders",
        "would remove" if dry_run else "removed",
        len(gone),
        len(dirs),
    )
    return {"namespaces": gone, "state_dirs": [str(d) for d in dirs], "dry_run": dry_run}


def reap_dead() -> dict:
    """What an emulation runs before it builds: :func:`cleanup` of every dead owner's leftovers,
    saying so in a warning (a live owner's network is left alone)."""
    out = cleanup()
    if out["namespaces"] or out["state_dirs"]:
        tags = sorted({ns[len(PREFIX) :].split("-")[0] for ns in out["namespaces"]})
        log.warning(
            "emulation: removed the leftovers of earlier runs whose owner is dead (tags %s): "
            "%d namespaces, %d state folders",
            ", ".join(tags) or "-",
            len(out["namespaces"]),
            len(out["state_dirs"]),
        )
    return out
