"""A helper process that runs a serial sweep's shared work ahead of its jobs, one task at a time
(and a large study's report beside its claims: :func:`repro.report.build.build_report`).

The serial launcher runs one job at a time and leaves a core idle; a mode's prefetch
(:attr:`repro.config.ModeSpec.prefetch`) queues the work its jobs will ask for, in job order,
and the helper process takes it from the head of the queue, one task at a time. The jobs take
from both ends (:func:`take`): a job that needs a task the helper has not started does it
itself; a job that would wait for the task the helper is running does the last queued task
instead, until its own is done (a task runs the same in either process). So neither side
waits while work is left, however their speeds compare. The process dies with its parent
(:func:`system.lifeline.die_with_parent`).

    helper = Helper(initializer)
    future = helper.submit(fn, *args)   # fn(*args) in the helper, or here if a job takes it
    helper.start()
    value = take(future)        # None: do it yourself
    helper.stop()

The worker is forked at its first task, after :meth:`Helper.start`: the tasks queued before then
are in its copy of this process, so only their ids are sent to it, not their arguments (a
study's rows would take a large share of the task's time to pickle, send and read back).
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, CancelledError, Future, ProcessPoolExecutor

from system.lifeline import die_with_parent

log = logging.getLogger(__name__)

__all__ = ["Helper", "take"]

# The tasks queued before their helper started, by id(Future), until they end: what a worker
# forked after them finds in its copy of this process.
_QUEUED_BEFORE_START: dict[int, tuple[Callable, tuple]] = {}


class Helper:
    """One forked worker process and a thread that feeds it the queued tasks in order."""

    def __init__(self, initializer: Callable[[], None] | None = None) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("fork"),
            initializer=functools.partial(_start, initializer),
        )
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable, *args) -> Future:
        """Queue ``fn(*args)`` (picklable): run in the worker, or in this process when a job takes
        it; a pending Future until one of them starts it."""
        ours = _Task()
        ours.helper = self
        with self._lock:
            self._queue.append((ours, fn, args))
        return ours

    def start(self) -> None:
        """Start feeding the queue to the worker (a daemon thread: it never holds up an exit)."""
        with self._lock:
            for ours, fn, args in self._queue:
                _QUEUED_BEFORE_START[id(ours)] = (fn, args)
        self._thread = threading.Thread(target=self._feed, name="helper-feeder", daemon=True)
        self._thread.start()

    def _pop(self, last: bool):
        with self._lock:
            while self._queue and not self._stopped:
                item = self._queue.pop() if last else self._queue.popleft()
                if item[0].set_running_or_notify_cancel():  # False: a job took it back
                    return item
                _QUEUED_BEFORE_START.pop(id(item[0]), None)
        return None

    def run_last_here(self) -> bool:
        """Do the last queued task in this process; False when none is left."""
        item = self._pop(last=True)
        if item is None:
            return False
        ours, fn, args = item
        _QUEUED_BEFORE_START.pop(id(ours), None)
        try:
            ours.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - the task's own error, for its job
            ours.set_exception(e)
        return True

    def _feed(self) -> None:
        while (item := self._pop(last=False)) is not None:
            ours, fn, args = item
            task = id(ours)
            try:
                if task in _QUEUED_BEFORE_START:  # the worker has it: send its id only
                    theirs = self._pool.submit(_run_queued, task)
                else:
                    theirs = self._pool.submit(fn, *args)
            except RuntimeError as e:  # the pool was shut down meanwhile
                _QUEUED_BEFORE_START.pop(task, None)
                ours.set_exception(BrokenExecutor(f"the helper is stopped: {e}"))
                continue
            try:
                ours.set_result(theirs.result())
            except CancelledError:
                ours.set_exception(BrokenExecutor("the helper was stopped"))
            except BaseException as e:  # noqa: BLE001 - the task's own error, for its job
                ours.set_exception(e)
            finally:
                _QUEUED_BEFORE_START.pop(task, None)

    def stop(self) -> None:
        """Drop every task not started and let the worker go (it ends its task, then exits)."""
        with self._lock:
            self._stopped = True
            for ours, *_ in self._queue:
                ours.cancel()
                _QUEUED_BEFORE_START.pop(id(ours), None)
            self._queue.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _run_queued(task: int):
    """In the worker: a task queued before it was forked (BrokenExecutor, which sends the task
    back to its job, if it was forked before the task was queued)."""
    if task not in _QUEUED_BEFORE_START:
        raise BrokenExecutor("the helper was started before this task was queued")
    fn, args = _QUEUED_BEFORE_START[task]
    return fn(*args)


def _start(initializer: Callable[[], None] | None) -> None:
    """The worker's start: it dies with this process, then runs the caller's initializer."""
    die_with_parent()
    if initializer is not None:
        initializer()


class _Task(Future):
    """A queued task's Future, knowing its helper (whose queue a waiting job works on)."""

    helper: Helper | None = None


# a job doing a task from the tail may need another: it takes that one from the queue too, but
# never waits by doing more tail tasks (one level is enough to keep both sides busy)
_WORKING = threading.local()


def take(value):
    """``value`` as a job finds it in a cache: itself if it is not a Future; a Future's result;
    or None where the job does the work itself — the helper has not started it (it is taken
    back) or is gone (stopped or killed). While the helper runs it, the job does the queue's
    last tasks here. An error the work itself raised is raised here."""
    if not isinstance(value, Future):
        return value
    if value.cancel():  # still queued: this process does it now, the helper goes on
        return None
    helper = getattr(value, "helper", None)
    if helper is not None and not getattr(_WORKING, "busy", False):
        _WORKING.busy = True
        try:
            while not value.done() and helper.run_last_here():
                pass
        finally:
            _WORKING.busy = False
    try:
        return value.result()
    except (CancelledError, BrokenExecutor) as e:
        log.warning("the helper process did not finish this work (%s): computing it here", e)
        return None
