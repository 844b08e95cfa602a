"""The serial sweep's helper process (repro/helper.py): the jobs take its queue from both ends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from repro.helper import Helper, take


def _nothing() -> None:
    pass


def _task(i: int, gate: str, parent: int) -> tuple[str, int]:
    """Where task ``i`` ran. In the helper the first task holds it until ``gate`` exists (at most
    30 s); here, the last task the job takes from the tail (task 1) lets the helper go on."""
    if os.getpid() == parent:
        if i == 1:
            Path(gate).touch()
        return "here", i
    deadline = time.monotonic() + 30.0
    while i == 0 and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return "there", i


def test_a_waiting_job_does_the_queues_last_tasks_itself(tmp_path):
    gate = str(tmp_path / "gate")
    helper = Helper(_nothing)
    try:
        tasks = [helper.submit(_task, i, gate, os.getpid()) for i in range(4)]
        helper.start()
        deadline = time.monotonic() + 30.0
        while not tasks[0].running() and time.monotonic() < deadline:  # the helper has task 0
            time.sleep(0.01)
        assert tasks[0].running()
        # waiting for task 0, the job does 3, 2 and 1 here; then task 0 ends in the helper
        assert take(tasks[0]) == ("there", 0)
        assert [take(t) for t in tasks[1:]] == [("here", 1), ("here", 2), ("here", 3)]
    finally:
        helper.stop()


def test_a_task_not_started_is_the_jobs_and_a_stopped_helper_leaves_none():
    helper = Helper(_nothing)
    first, second = (helper.submit(_task, i, "unused", os.getpid()) for i in (5, 6))
    assert take(first) is None and first.cancelled()  # not started: the job does it itself
    helper.stop()
    assert take(second) is None  # dropped with the helper: the job does it itself
    assert take(7) == 7  # a value made before is just returned


def test_the_tasks_own_error_reaches_its_job():
    helper = Helper(_nothing)
    try:
        task = helper.submit(_fail, 3, "unused")
        helper.run_last_here()  # as a waiting job would
        with pytest.raises(ValueError, match="task 3"):
            take(task)
    finally:
        helper.stop()


def _fail(i: int, gate: str) -> None:
    raise ValueError(f"task {i} failed")


def _where_and(value) -> tuple[int, object]:
    return os.getpid(), value()


def test_a_task_queued_before_the_start_reaches_the_worker_without_pickling():
    """The worker is forked after the tasks queued before start(): it runs them from its copy of
    this process, so even an argument that cannot be pickled (a lambda) gets there."""
    import repro.helper as helper_module

    helper = Helper(_nothing)
    try:
        before = helper.submit(_where_and, lambda: "kept")
        helper.start()
        pid, value = take(before)
        assert pid != os.getpid() and value == "kept"
        assert not helper_module._QUEUED_BEFORE_START  # dropped once done
    finally:
        helper.stop()
