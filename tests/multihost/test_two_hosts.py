"""Two hosts for real on one machine: torchrun agents in two namespaces across an emulated WAN.

Each "host" is a network namespace (``dtfm-mh<pid>-d0``, ``-d1``; 198.18.0.1 and .2) on a bridge
namespace that adds the WAN's one-way delay to every packet between them (the NFQUEUE delayer,
or netem leaves where the kernel has sch_netem). Inside each host the test applies the
per-host script that ``python -m system.emulation tc-script`` writes for real hosts (HTB with
ACK and data leaves, window-clamped CUBIC routes, TCP sysctls), starts one torchrun agent
(``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on host 0) and trains the debug GPT with
pp=2 across the hosts and dp=2 inside each. Checks: the losses equal a single-process run's
within 1e-4; the median iteration time is within 15% of the simulator's prediction for the same
four devices, two hosts and WAN link (fed with the compute times measured in the run, as the
emulation validation does); nothing the test made is left: namespaces, state, processes.

The namespaces carry the tag ``mh<pid>`` (never a hex pid tag, which other emulation runs use);
namespaces of an earlier, killed run of this test are removed at the start, others never.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from system.cluster import Cluster, LinkSharing
from system.emulation import tcscript
from system.emulation.cleanup import cleanup
from system.emulation.netns import STATE_ROOT, Emulation
from system.emulation.plan import PREFIX, make_plan
from system.emulation.shell import netns_list, run_cmd
from system.runtime.launch import kill_all, launch
from system.runtime.spec import RunSpec
from tests.emulation._skip import _why_skip

pytestmark = [
    pytest.mark.emulation,
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_why_skip()), reason=_why_skip() or "ok"),
]

ROOT = Path(__file__).resolve().parents[2]
TAG_PREFIX = "mh"  # this test's namespaces only: dtfm-mh<pid hex>-*
WAN_DELAY_MS = 20.0  # one-way (RTT 40 ms)
# Sizes: the simulator over-predicts this run by a roughly fixed ~40 ms per iteration, so the
# messages are made large enough for that to stay small. With 64 KiB messages at 50 Mbit/s it was
# +12..+18% on 2 cores; part of it is HTB's token bucket (8 ms of rate, refilled while a direction
# idles between the forward and the backward pass; the alpha-beta model has no burst): a 1 ms
# bucket gave +10%. The rest is not yet attributed. Here each message (1 x 64 x 512 fp32 =
# 128 KiB) is about 6x the bucket (20 KB at 20 Mbit/s) and the run measured +4%.
WAN_GBPS = 0.02  # 20 Mbit/s goodput between the hosts
LOCAL_GBPS, LOCAL_DELAY_MS = 5.0, 0.05  # ranks of one host talk over loopback
RUN_TIMEOUT_S = 300
SPEC = dict(
    model="debug",
    hidden_size=512,
    seq_length=64,
    vocab_size=128,
    global_batch_size=8,
    micro_batch_size=1,
    iters=6,
    warmup_iters=2,
    seed=0,
)


def _remove_stale_runs() -> None:
    """Namespaces and state of earlier runs of this test whose process is gone (only ours)."""
    cleanup(prefix=TAG_PREFIX)


def _device_cluster() -> Cluster:
    """Four devices, two per host; the hosts joined by the WAN link (their NICs shared)."""
    host_of = (0, 0, 1, 1)
    same = np.equal.outer(host_of, host_of)
    return Cluster(
        name="two-hosts",
        region_of=("a", "a", "b", "b"),
        host_of=host_of,
        delay_ms=np.where(same, LOCAL_DELAY_MS, WAN_DELAY_MS),
        bandwidth_gbps=np.where(same, LOCAL_GBPS, WAN_GBPS),
        link_sharing=LinkSharing("pair"),
        host_nic_gbps=(WAN_GBPS, WAN_GBPS),
        description="tests/multihost",
    )


def _host_cluster() -> Cluster:
    """One device per host: what the namespaces emulate (the bridge's delay table)."""
    off = 1.0 - np.eye(2)
    return Cluster(
        name="two-hosts-wan",
        region_of=("a", "b"),
        host_of=(0, 1),
        delay_ms=off * WAN_DELAY_MS,
        bandwidth_gbps=off * WAN_GBPS + np.eye(2),
        link_sharing=LinkSharing("pair"),
    )


@pytest.fixture
def hosts(tmp_path):
    """The two emulated hosts, each shaped by its generated script; everything removed after."""
    _remove_stale_runs()
    tag = f"{TAG_PREFIX}{os.getpid() % 0x100000:x}"
    plan = make_plan(_host_cluster(), tag=tag)
    scripts = tcscript.write_scripts(
        _device_cluster(), [plan.ip(0), plan.ip(1)], tmp_path / "tc", dev="eth0", mtu=9000
    )
    with Emulation(plan, shape_egress=False) as emu:
        delay = "netem" if emu.backend == "netem" else "path"  # path: the bridge delays
        env = {**os.environ, "DTFM_DELAY": delay, "DTFM_STATE": str(tmp_path)}
        for k, script in enumerate(scripts):
            p = subprocess.run(
                [*emu.exec_prefix(k), "bash", str(script), "apply"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert p.returncode == 0, f"{script.name} apply: {p.stderr}"
            shown = run_cmd(["tc", "class", "show", "dev", "eth0"], ns=plan.device_ns(k)).stdout
            assert shown.count("class htb") == 4 and "prio 0" in shown  # default, link, ACK, data
        yield emu, scripts, env
        for k, script in enumerate(scripts):
            subprocess.run(
                [*emu.exec_prefix(k), "bash", str(script), "clear"],
                env=env,
                capture_output=True,
                timeout=60,
                check=True,
            )
    # nothing of ours is left
    assert not [ns for ns in netns_list() if ns.startswith(f"{PREFIX}{tag}")]
    assert not (STATE_ROOT / f"{PREFIX}{tag}").exists()
    assert not list(tmp_path.glob("dtfm-tc-host*.sysctl"))


def _torchrun_on_hosts(emu, spec_path: Path, log_dir: Path) -> None:
    port = 29500
    procs, logs = [], []
    try:
        for k in range(2):
            addr = emu.plan.ip(k)
            cmd = [
                *emu.exec_prefix(k),
                sys.executable,
                "-m",
                "system.runtime.torchrun",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{emu.plan.ip(0)}:{port}",
                "--rdzv-id",
                "twohosts",
                "--rdzv-conf",
                f"is_host={int(k == 0)}",
                "--local-addr",
                addr,
                "--max-restarts",
                "0",
                "-m",
                "system.runtime.worker",
                str(spec_path),
            ]
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "eth0",
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
                ),
            }
            logs.append(log_dir / f"host{k}.log")
            with open(logs[-1], "wb") as out:
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while any(p.poll() is None for p in procs):
            bad = [k for k, p in enumerate(procs) if p.poll() not in (None, 0)]
            assert not bad, f"host {bad[0]} failed:\n{logs[bad[0]].read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out:\n{logs[0].read_text()[-3000:]}"
            time.sleep(0.1)
        for k, p in enumerate(procs):
            assert p.returncode == 0, f"host {k} failed:\n{logs[k].read_text()[-3000:]}"
    finally:
        kill_all(procs)


def test_pp_across_two_hosts_dp_inside_each(hosts, tmp_path):
    from repro.modes.emulate.run import measured_compute
    from system.simulator import simulate_ours
    from system.workload import Workload

    emu, scripts, _ = hosts
    margin_s = max(0.5, 4 * 2 * WAN_DELAY_MS / 1e3)  # rank 0's start instant crosses the WAN
    spec = RunSpec(
        **SPEC,
        pp=2,
        dp=2,
        start="clock",
        start_margin_s=margin_s,
        metrics_out=str(tmp_path / "metrics.json"),
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.resolved().to_json())
    _torchrun_on_hosts(emu, spec_path, tmp_path)
    m = json.loads((tmp_path / "metrics.json").read_text())

    # the same training in one process, on loopback
    ref = launch(RunSpec(**SPEC, pp=1, dp=1), timeout_s=RUN_TIMEOUT_S)
    np.testing.assert_allclose(m["losses"], ref["losses"], rtol=0, atol=1e-4)

    # the simulator on the same four devices, two hosts and WAN, with the run's compute times
    assign = spec.assignment()
    wl = Workload(
        model=spec.gpt_config(),
        global_batch_size=spec.global_batch_size,
        micro_batch_size=spec.micro_batch_size,
        activation_bytes=4,
        gradient_bytes=4,
    )
    compute = measured_compute(m, spec.pp, spec.warmup_iters)
    sim = simulate_ours(_device_cluster(), assign, wl, compute=compute)
    meas = float(m["iter_time_median_s"])
    print(
        f"two hosts: measured {meas:.3f} s/iteration, simulated {sim.iter_time_s:.3f} s "
        f"({100 * (sim.iter_time_s / meas - 1):+.1f}%), iterations {m['iter_time_s']}, "
        f"stages on hosts {m['stage_of_rank']}, backend {emu.backend}"
    )
    assert sim.iter_time_s == pytest.approx(meas, rel=0.15)
    # the WAN matters: without it the simulator predicts a clearly shorter iteration, so a run
    # whose tc script or delay did not take effect would fail the check above
    lan = Cluster(
        name="one-host",
        region_of=("a",) * 4,
        host_of=(0, 0, 0, 0),
        delay_ms=np.full((4, 4), LOCAL_DELAY_MS),
        bandwidth_gbps=np.full((4, 4), LOCAL_GBPS),
        link_sharing=LinkSharing("pair"),
    )
    no_wan_s = simulate_ours(lan, assign, wl, compute=compute).iter_time_s
    print(f"without the WAN the simulator predicts {no_wan_s:.3f} s")
    assert no_wan_s < meas / 1.15**2
    assert sorted(m["stage_of_rank"]) == [0, 0, 1, 1]


def test_a_killed_run_is_cleaned_up_by_the_next(tmp_path):
    """SIGKILL leaves the hosts behind; the next run of this test removes them (and only them)."""
    tag = f"{TAG_PREFIX}k{os.getpid() % 0x10000:x}"
    code = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.multihost.test_two_hosts import _host_cluster\n"
        "from system.emulation.netns import Emulation\n"
        "from system.emulation.plan import make_plan\n"
        f"emu = Emulation(make_plan(_host_cluster(), tag={tag!r}), shape_egress=False)\n"
        "emu.setup(); print('ready', flush=True); time.sleep(120)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        ours = [ns for ns in netns_list() if ns.startswith(f"{PREFIX}{tag}-")]
        assert len(ours) == 3  # two hosts and the bridge
        p.kill()
        p.wait(timeout=10)
        assert [ns for ns in netns_list() if ns.startswith(f"{PREFIX}{tag}-")] == ours
        _remove_stale_runs()
        assert not [ns for ns in netns_list() if ns.startswith(f"{PREFIX}{tag}-")]
        assert not (STATE_ROOT / f"{PREFIX}{tag}").exists()
    finally:
        p.kill()
        p.wait(timeout=10)
        _remove_stale_runs()
