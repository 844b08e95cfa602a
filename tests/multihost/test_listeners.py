"""Every listening socket of a local run binds loopback: stores, gloo, torchrun's agent.

A sampler thread reads ``/proc/net/tcp{,6}`` (LISTEN sockets) and maps their inodes to the
processes under this test (``/proc/<pid>/fd``) while a run of our runtime and a Megatron
baseline run go; every socket it sees must be bound to 127.0.0.1 (or ::1). The test fails when
it sees no listener at all (the sampler would then have proven nothing).
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest

from repro.checks.leftovers import listening, socket_inodes
from system.lifeline import descendants
from system.runtime.launch import launch
from system.runtime.spec import RunSpec

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# the smallest two-stage run of the debug GPT, for our runtime and the baselines alike
TINY_RUN = dict(
    model="debug",
    layers=2,
    hidden_size=64,
    seq_length=16,
    vocab_size=64,
    pp=2,
    dp=1,
    global_batch_size=2,
)
_LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc shows them


class _Sampler(threading.Thread):
    """Collects (pid, address) of LISTEN sockets owned by this process's descendants."""

    def __init__(self, period_s: float = 0.05, limit_s: float = 600.0) -> None:
        super().__init__(daemon=True)
        self.seen: set[tuple[int, str]] = set()
        self._stop_event = threading.Event()
        self._period_s, self._limit_s = period_s, limit_s

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._stop_event.is_set() and time.monotonic() - t0 < self._limit_s:
            listen = listening()
            for pid in descendants(os.getpid()):
                for inode in socket_inodes(pid) & listen.keys():
                    self.seen.add((pid, listen[inode]))
            time.sleep(self._period_s)

    def stop(self) -> set[tuple[int, str]]:
        self._stop_event.set()
        self.join(timeout=5)
        return self.seen


def _check(seen: set[tuple[int, str]], min_listeners: int) -> None:
    addrs = {a for _, a in seen}
    assert len(seen) >= min_listeners, f"sampler saw only {sorted(seen)}"
    wide = sorted(a for a in addrs if a.split(":")[0] not in _LOOPBACK)
    assert not wide, f"listeners not on loopback: {wide}"


@pytest.mark.parametrize("way", ["torchrun", "per_rank"])
def test_runtime_run_listens_on_loopback_only(way, tmp_path):
    sampler = _Sampler()
    sampler.start()
    try:
        spec = RunSpec(**TINY_RUN, iters=3)
        prefix = None if way == "torchrun" else [[], []]
        env = None if way == "torchrun" else [{"GLOO_SOCKET_IFNAME": "lo"}] * 2
        launch(spec, timeout_s=180, log_dir=tmp_path, rank_prefix=prefix, rank_env=env)
    finally:
        seen = sampler.stop()
    # torchrun: its rendezvous store + the workers' store + one gloo listener per rank;
    # one process per rank: rank 0's store + one gloo listener per rank
    _check(seen, min_listeners=4 if way == "torchrun" else 3)


@pytest.mark.baseline
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
def test_baseline_run_listens_on_loopback_only(tmp_path):
    from baselines.grid import BaselineSpec, run_point

    sampler = _Sampler()
    sampler.start()
    try:
        spec = BaselineSpec(system="megatron", **TINY_RUN, iters=2)
        res = run_point(spec, timeout_s=240, work_dir=tmp_path)
    finally:
        seen = sampler.stop()
    assert res["status"] == "ok", res
    _check(seen, min_listeners=4)


def test_sampler_sees_a_wildcard_listener():
    """The check can fail: a socket bound to every interface is reported."""
    import socket
    import subprocess
    import sys

    sampler = _Sampler()
    sampler.start()
    code = (
        "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
        "time.sleep(1.0)"
    )
    try:
        subprocess.run([sys.executable, "-c", code], timeout=30, check=True)
    finally:
        seen = sampler.stop()
    with pytest.raises(AssertionError, match="not on loopback"):
        _check(seen, min_listeners=1)
    del socket
