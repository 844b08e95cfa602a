"""Link verification tells a loaded machine from a broken emulator (no root: probes faked)."""

from __future__ import annotations

import pytest

from system.cases import get_case
from system.emulation import verify
from system.emulation.plan import make_plan
from system.emulation.shell import EmulationError


@pytest.fixture
def plan():
    return make_plan(get_case("debug").subset([0, 2]), bandwidth_scale=0.1, tag="tload")


def _fake(monkeypatch, plan, *, good_after: int, busy: list[float]):
    """Probes that miss until measurement ``good_after``, and a CPU load that follows ``busy``."""
    n = {"probe": 0}

    def rtt(p, i, j, count=6):
        n["probe"] += 1
        off = 1.0 if n["probe"] <= good_after else 0.0
        return 2e3 * float(p.delay_s[i, j]) * (1 + off)

    monkeypatch.setattr(verify, "measure_rtt_ms", rtt)
    monkeypatch.setattr(
        verify, "measure_capacity_gbps", lambda p, i, j: float(p.goodput_bps[i, j]) / 1e9
    )
    monkeypatch.setattr(
        verify,
        "measure_tcp_s",
        lambda p, i, j, nbytes: float(
            p.delay_s[i, j] + p.delay_s[j, i] + 8.0 * nbytes / p.goodput_bps[i, j]
        ),
    )
    loads = iter(busy)
    monkeypatch.setattr(verify, "busy_cpus", lambda window_s=1.0: (next(loads, busy[-1]), 2))
    monkeypatch.setattr(verify, "time", _Clock())
    return n


class _Clock:
    """A clock that a sleep moves forward: waits cost no wall time."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_a_miss_under_load_is_measured_again_after_the_load_falls(monkeypatch, plan):
    _fake(monkeypatch, plan, good_after=4, busy=[2.0, 2.0, 0.1, 0.1])
    rep = verify.verify_links(plan, pairs=2, retries=1, backoff_s=60)
    assert rep["ok"] and rep["busy_cpus"] == 0.1 and rep["cpus"] == 2
    assert all(len(p["attempts"]) >= 2 for p in rep["pairs"])


def test_a_miss_that_stays_under_load_says_so_with_the_load(monkeypatch, plan):
    _fake(monkeypatch, plan, good_after=100, busy=[1.9])
    with pytest.raises(verify.EmulationOverloaded) as e:
        verify.verify_links(plan, pairs=2, retries=1, backoff_s=10)
    msg = str(e.value)
    assert "off target by more than 10%" in msg
    assert "while this machine was loaded by other work (1.9 of 2 CPUs busy" in msg
    assert "after waiting 10 s for it to fall" in msg


def test_a_miss_on_an_idle_machine_is_a_broken_emulator(monkeypatch, plan):
    _fake(monkeypatch, plan, good_after=100, busy=[0.1])
    with pytest.raises(EmulationError) as e:
        verify.verify_links(plan, pairs=2, retries=1)
    assert not isinstance(e.value, verify.EmulationOverloaded)
    assert "loaded" not in str(e.value)


def test_busy_cpus_reads_this_machine():
    busy, cpus = verify.busy_cpus(0.2)
    assert cpus >= 1 and 0.0 <= busy <= cpus
