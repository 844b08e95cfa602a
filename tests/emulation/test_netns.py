"""Emulated links in network namespaces: accuracy and cleanup (needs root, ip, tc, iptables)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from repro.checks.leftovers import guard_of
from system.cases import get_case
from system.emulation.cleanup import STATE_ROOT
from system.emulation.netns import Emulation
from system.emulation.plan import make_plan
from system.emulation.shell import netns_list
from system.emulation.verify import measure_rtt_ms, verify_links
from tests.emulation._poll import wait_for
from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]


def _ours(tag: str) -> list[str]:
    return [ns for ns in netns_list() if ns.startswith(f"dtfm-{tag}-")]


@pytest.mark.slow
def test_links_within_ten_percent_of_target():
    # one device per region of the debug case: 10-143 ms one-way, 0.3-0.79 Gbit/s (x0.1)
    plan = make_plan(get_case("debug").subset([0, 2, 4, 6]), bandwidth_scale=0.1, tag="tlink")
    with Emulation(plan) as emu:
        rep = verify_links(plan, pairs=5, tolerance=0.10, on_fail="raise", seed=1)
        stats = emu.delayer_stats()
    assert rep["ok"] and len(rep["pairs"]) == 5
    for p in rep["pairs"]:
        assert abs(p["rtt_err"]) <= 0.10 and abs(p["bw_err"]) <= 0.10
    assert stats == {} or stats["delayed"] > 0
    assert not _ours("tlink")


def test_rtt_is_twice_the_one_way_delay_and_cleanup_after_error(tmp_path):
    c = get_case("debug").subset([0, 2])  # Oregon-Virginia: 67 ms one-way
    plan = make_plan(c, tag="terr")
    with pytest.raises(RuntimeError, match="boom"):
        with Emulation(plan) as emu:
            assert len(_ours("terr")) == 3
            rtt = measure_rtt_ms(plan, 0, 1, count=4)
            assert rtt == pytest.approx(2 * c.delay_ms[0, 1], rel=0.10)
            state = emu.state_dir
            raise RuntimeError("boom")
    assert not _ours("terr")
    assert not state.exists()


_CHILD = textwrap.dedent("""
    import sys, time
    from system.cases import get_case
    from system.emulation.netns import Emulation
    from system.emulation.plan import make_plan
    with Emulation(make_plan(get_case("debug").subset([0, 2]), tag=sys.argv[1])):
        print("up", flush=True)
        time.sleep(60)
""")


def _start_child(tag: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _CHILD, tag], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    assert len(_ours(tag)) == 3
    return p


def test_sigterm_sighup_and_ctrl_c_clean_up():
    for tag, sig in (("tterm", signal.SIGTERM), ("thup", signal.SIGHUP), ("tint", signal.SIGINT)):
        p = _start_child(tag)
        p.send_signal(sig)
        p.wait(timeout=90)  # cleanup runs ip(8) per namespace: slow on a saturated machine
        assert not _ours(tag), f"{sig!r} left namespaces behind"


def test_a_sigkilled_run_is_cleaned_up_by_its_guard():
    p = _start_child("tkill")
    state = STATE_ROOT / "dtfm-tkill"
    assert state.is_dir()
    p.kill()  # SIGKILL: no handler runs; the guard removes the network
    p.wait(timeout=10)
    assert wait_for(lambda: not _ours("tkill") and not state.exists(), 30), _ours("tkill")
    # the delayer died with its parent (PR_SET_PDEATHSIG) or with its namespace
    assert wait_for(
        lambda: (
            not subprocess.run(["pgrep", "-f", "dtfm-tkill/delays"], capture_output=True).stdout
        ),
        5,
    )


def test_the_next_run_removes_a_dead_owners_leftovers_and_leaves_a_live_ones(caplog):
    live = _start_child("tlive")
    dead = _start_child("tdead")
    os.kill(guard_of(dead.pid), signal.SIGKILL)  # the guard dies first: nothing cleans up
    dead.kill()
    dead.wait(timeout=10)
    assert len(_ours("tdead")) == 3
    try:
        with caplog.at_level(logging.WARNING, logger="system.emulation.cleanup"):
            with Emulation(make_plan(get_case("debug").subset([0, 2]), tag="tnext")):
                assert len(_ours("tnext")) == 3
        assert not _ours("tdead") and not (STATE_ROOT / "dtfm-tdead").exists()
        assert len(_ours("tlive")) == 3, "a live owner's namespaces were removed"
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "removed the leftovers of earlier runs whose owner is dead (tags tdead)" in said
        # the same tag as a live run is refused, not shared
        with pytest.raises(RuntimeError, match="'tlive' is in use by the live process"):
            with Emulation(make_plan(get_case("debug").subset([0, 2]), tag="tlive")):
                pass
        assert len(_ours("tlive")) == 3
    finally:
        live.terminate()
        live.wait(timeout=30)
    assert not _ours("tlive")


def test_cleanup_command_touches_only_dead_owners():
    live = _start_child("tcmd")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "system.emulation", "cleanup"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert len(_ours("tcmd")) == 3
    finally:
        live.terminate()
        live.wait(timeout=30)
