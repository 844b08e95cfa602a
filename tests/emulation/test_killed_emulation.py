"""A killed ``mode=emulate`` run leaves no process, namespace, qdisc, iptables rule or folder.

The run builds 5 namespaces (4 devices and the bridge, where the NFQUEUE rule and the delayers
live), shapes every device's egress with HTB, and trains 4 ranks inside the namespaces. The
test waits for the ranks, kills the entry process (SIGTERM as ``timeout`` and Slurm do, or
SIGKILL) and looks for anything of the run on the machine: its processes, its namespaces (the
qdiscs and the iptables rule live only in them), its state and run folders, and any change to
the host's own qdiscs and iptables rules.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from repro.checks.leftovers import cmdline, left_after, snapshot, start_job, stop
from repro.checks.probe_inputs.hostile import EMULATE  # 4 devices, a loaded machine only warns
from system.emulation.cleanup import STATE_ROOT
from system.emulation.shell import netns_list
from system.lifeline import descendants
from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]


def _host_network() -> tuple[str, str]:
    """The host namespace's qdiscs and iptables rules (an emulation must never touch them)."""
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    return qdiscs, rules


def _tag_of(pid: int) -> str | None:
    for d in STATE_ROOT.glob("dtfm-*"):
        try:
            st = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if st.get("owner_pid") == pid:
            return st["tag"]
    return None


def _ranks(pid: int) -> list[int]:
    return [d for d in descendants(pid) if "system.runtime.worker" in cmdline(d)]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_emulate_run_leaves_nothing_behind(tmp_path, sig):
    host_before = _host_network()
    p = start_job(*EMULATE, "iters=20000", f"results_dir={tmp_path / 'R'}")
    before = None
    try:
        end = time.monotonic() + 300
        while len(_ranks(p.pid)) < 4:
            assert p.poll() is None, p.stdout.read()[-3000:]
            assert time.monotonic() < end, "the emulated ranks did not start in 300 s"
            time.sleep(0.2)
        time.sleep(3.0)
        tag = _tag_of(p.pid)
        assert tag, "no emulation state names the run as its owner"
        ours = [ns for ns in netns_list() if ns.startswith(f"dtfm-{tag}-")]
        assert len(ours) == 5, ours
        run_dirs = {
            str(Path(a).parent) for r in _ranks(p.pid) for a in cmdline(r) if a.endswith(".json")
        }
        before = snapshot(p.pid, {str(STATE_ROOT / f"dtfm-{tag}"), *run_dirs})
        assert len(before.procs) >= 8 and len(before.folders) == 2, before  # ranks, delayers
        p.send_signal(sig)
        p.wait(timeout=60)
        left = left_after(before, timeout_s=60)
        assert left == {"processes": [], "ports": [], "folders": []}, left
        assert not [ns for ns in netns_list() if ns.startswith(f"dtfm-{tag}-")]
        assert _host_network() == host_before
    finally:
        stop(p, before)
