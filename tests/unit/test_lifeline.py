"""system.lifeline.exit_now: a finished rank leaves with its code, its output flushed, and no
interpreter finalization (where gloo's live threads can abort the process)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# every module the launcher starts as a rank (python -m MODULE SPEC.json)
RANK_MODULES = [
    "system/runtime/worker.py",
    "system/runtime/exchange_bench.py",
    "baselines/deepspeed/train.py",
    "baselines/megatron/train.py",
]


def test_exit_now_flushes_and_skips_finalization(tmp_path):
    log_path = tmp_path / "log.txt"
    script = textwrap.dedent(
        f"""
        import atexit, logging, sys
        from system.lifeline import exit_now
        logging.basicConfig(filename={str(log_path)!r}, level=logging.INFO)
        logging.getLogger("x").info("logged line")
        atexit.register(lambda: print("finalized", flush=True))
        class Finalized:
            def __del__(self):
                print("destructor ran", flush=True)
        keep = Finalized()
        sys.stdout.write("buffered line")  # a pipe: block-buffered, not yet written
        exit_now(7)
        print("after exit_now")
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 7, p.stderr
    assert p.stdout == "buffered line", p.stdout
    assert "logged line" in log_path.read_text()


@pytest.mark.parametrize("path", RANK_MODULES)
def test_every_rank_module_leaves_through_exit_now(path):
    """The ``if __name__ == "__main__"`` block of each rank module ends in ``exit_now(...)``."""
    tree = ast.parse((ROOT / path).read_text())
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(mains) == 1, f"{path}: one __main__ block expected"
    last = mains[0].body[-1]
    assert (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and ast.unparse(last.value.func) == "exit_now"
    ), f"{path}: the __main__ block ends in {ast.unparse(last)!r}, not exit_now(...)"


def test_a_guarded_child_dies_with_its_killed_parent(tmp_path):
    # the parent runs `sleep 60` through run_guarded and is SIGKILLed: the sleep goes too
    import os
    import signal
    import time

    from system.lifeline import descendants, pid_alive

    code = "from system.lifeline import run_guarded; run_guarded(['sleep', '60'], timeout_s=120)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    try:
        child = None
        for _ in range(200):  # up to 20 s for the child to start
            kids = [
                d for d in descendants(parent.pid) if "sleep" in Path(f"/proc/{d}/comm").read_text()
            ]
            if kids:
                child = kids[0]
                break
            time.sleep(0.1)
        assert child is not None, "the guarded child never started"
        time.sleep(0.5)  # the guard holds the kill action once on_death returned
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        for _ in range(100):  # up to 10 s for the guard to kill it
            if not pid_alive(child):
                break
            time.sleep(0.1)
        assert not pid_alive(child), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_a_guarded_child_past_its_time_is_killed():
    from system.lifeline import run_guarded

    with pytest.raises(subprocess.TimeoutExpired):
        run_guarded(["sleep", "30"], timeout_s=0.5)
    done = run_guarded([sys.executable, "-c", "print('ok')"], timeout_s=60)
    assert done.returncode == 0 and done.stdout == "ok\n"
