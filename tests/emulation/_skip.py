"""Why the emulation tests cannot run here ("" when they can)."""

from __future__ import annotations

import importlib.util
import os

from system.emulation.netns import has_netem
from system.emulation.shell import missing_tools


def _why_skip() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if missing_tools(("ip", "tc", "iptables", "ping")):
        missing = missing_tools(("ip", "tc", "iptables", "ping"))
        return f"needs {missing} (apt-get install iproute2 iptables iputils-ping)"
    if importlib.util.find_spec("netfilterqueue") is None and not has_netem():
        return "no sch_netem and no netfilterqueue (pip install netfilterqueue)"
    return ""
