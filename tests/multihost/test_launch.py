"""The one launcher (system.runtime.launch.run_ranks): torchrun and one process per rank.

Fake rank modules (no torch.distributed) check the bookkeeping both ways of starting ranks
share: torchrun's environment, a failing rank stops every other, the time limit kills them all.
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from system.runtime.launch import LaunchError, LaunchTimeout, run_ranks

pytestmark = [pytest.mark.dist]

WAYS = ["torchrun", "per_rank"]


def _module(tmp_path, monkeypatch, body: str) -> None:
    (tmp_path / "fake_rank.py").write_text(textwrap.dedent(body))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    )


def _prefix(way: str, n: int):
    return None if way == "torchrun" else [[] for _ in range(n)]


def _run_fake(way: str, n: int, tmp_path, timeout_s: float) -> None:
    """``n`` ranks of the fake module, logs in ``tmp_path/logs``."""
    run_ranks(
        "fake_rank",
        [],
        world_size=n,
        rank_prefix=_prefix(way, n),
        timeout_s=timeout_s,
        log_dir=tmp_path / "logs",
    )


@pytest.mark.parametrize("way", WAYS)
def test_a_failing_rank_stops_all(way, tmp_path, monkeypatch):
    _module(
        tmp_path,
        monkeypatch,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("rank one fails", flush=True)
            sys.exit(3)
        time.sleep(60)
    """,
    )
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 exited with code 3") as e:
        _run_fake(way, 3, tmp_path, timeout_s=45)
    assert time.monotonic() - t0 < 40 and e.value.rank == 1 and e.value.returncode == 3
    assert "rank one fails" in (tmp_path / "logs" / "rank1.log").read_text()


@pytest.mark.parametrize("way", WAYS)
def test_an_aborted_rank_leaves_its_python_stack_in_its_log(way, tmp_path, monkeypatch):
    """SIGABRT from C++ (as gloo's "terminate called") says where the rank was: the log holds
    the faulthandler's stack of the aborting frame."""
    _module(
        tmp_path,
        monkeypatch,
        """
        import os, time
        def aborting_frame_of_rank_zero():
            os.abort()
        if os.environ["RANK"] == "0":
            aborting_frame_of_rank_zero()
        time.sleep(60)
    """,
    )
    with pytest.raises(LaunchError) as e:
        _run_fake(way, 2, tmp_path, timeout_s=45)
    assert e.value.rank == 0, e.value
    text = (tmp_path / "logs" / "rank0.log").read_text()
    assert "Fatal Python error: Aborted" in text and "aborting_frame_of_rank_zero" in text, text


@pytest.mark.parametrize("way", WAYS)
def test_time_limit_kills_every_rank(way, tmp_path, monkeypatch):
    _module(
        tmp_path,
        monkeypatch,
        """
        import os, pathlib, time
        pathlib.Path(os.environ["PIDS"], os.environ["RANK"]).write_text(str(os.getpid()))
        time.sleep(60)
    """,
    )
    (tmp_path / "pids").mkdir()
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    with pytest.raises(LaunchTimeout):
        _run_fake(way, 2, tmp_path, timeout_s=8)
    pids = [int(p.read_text()) for p in (tmp_path / "pids").iterdir()]
    assert len(pids) == 2
    for pid in pids:  # killed, not orphaned
        assert (
            not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
        )


@pytest.mark.parametrize("way", WAYS)
def test_ranks_get_torchruns_environment(way, tmp_path, monkeypatch):
    _module(
        tmp_path,
        monkeypatch,
        """
        import os, pathlib, sys
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "OMP_NUM_THREADS", "MARK")
        out = pathlib.Path(sys.argv[1]) / f"seen{os.environ['RANK']}"
        out.write_text(" ".join(os.environ.get(k, "-") for k in keys))
    """,
    )
    monkeypatch.setenv("MARK", "all")
    prefix = _prefix(way, 2)
    env = None if prefix is None else [{"MARK": f"m{r}"} for r in range(2)]
    run_ranks(
        "fake_rank",
        [str(tmp_path)],
        world_size=2,
        rank_prefix=prefix,
        rank_env=env,
        timeout_s=60,
        log_dir=tmp_path / "logs",
    )
    for r in range(2):
        rank, world, local, addr, omp, mark = (tmp_path / f"seen{r}").read_text().split()
        assert (rank, world, local, addr, omp) == (str(r), "2", str(r), "127.0.0.1", "1")
        assert mark == ("all" if way == "torchrun" else f"m{r}")


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank_prefix has 2 entries"):
        run_ranks("m", [], world_size=3, rank_prefix=[[], []], log_dir="unused")
    with pytest.raises(ValueError, match="rank_env needs rank_prefix"):
        run_ranks("m", [], world_size=1, rank_env=[{}], log_dir="unused")
    with pytest.raises(ValueError, match="timeout_s"):
        run_ranks("m", [], world_size=1, timeout_s=0, log_dir="unused")


def test_per_rank_rendezvous_address_need_not_be_local(tmp_path, monkeypatch):
    """The emulation's master address lives in a namespace, not on this host."""
    _module(
        tmp_path,
        monkeypatch,
        """
        import os, pathlib, sys
        (pathlib.Path(sys.argv[1]) / "addr").write_text(os.environ["MASTER_ADDR"])
    """,
    )
    run_ranks(
        "fake_rank",
        [str(tmp_path)],
        world_size=1,
        rank_prefix=[[]],
        master_addr="198.18.255.1",
        timeout_s=60,
        log_dir=tmp_path / "logs",
    )
    assert (tmp_path / "addr").read_text() == "198.18.255.1"
