"""Per-rank timing of compute and communication spans, and an optional Chrome trace.

Categories: ``compute`` (forward/backward of a micro-batch), ``wait`` (blocked on a pipeline
receive or send), ``dp`` (gradient exchange), ``optim`` (optimizer step), ``iter`` (one whole
iteration, from the barrier). Trace times are the machine's monotonic clock, so the ranks of one
host line up. On CUDA, compute spans
are timed with CUDA events (the host does not block), resolved by :meth:`Timeline.flush` after a
synchronize at the end of the iteration.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

__all__ = ["Timeline", "merge_traces"]


class Timeline:
    """Collects (category, name, start_s, dur_s) spans for one rank."""

    def __init__(self, rank: int, *, use_cuda_events: bool = False, keep_events: bool = False):
        self.rank = rank
        self.use_cuda = use_cuda_events
        self.keep = keep_events
        self.events: list[dict] = []
        self._pending: list[tuple] = []
        self.totals: dict[str, float] = defaultdict(float)
        self.spans: dict[str, list[float]] = defaultdict(list)  # per name prefix ("F", "B")

    def reset_totals(self) -> None:
        self.totals = defaultdict(float)
        self.spans = defaultdict(list)

    def _add(self, cat: str, name: str, start: float, dur: float) -> None:
        self.totals[cat] += dur
        if cat == "compute":
            self.spans[name[:1]].append(dur)
        if self.keep:
            self.events.append(
                {
                    "name": name,
                    "cat": cat,
                    "ph": "X",
                    "pid": self.rank,
                    "tid": cat,
                    # the machine's monotonic clock: ranks on one host (the WAN emulation) line up
                    "ts": start * 1e6,
                    "dur": dur * 1e6,
                }
            )

    @contextmanager
    def span(self, cat: str, name: str):
        """Time the body; compute spans on CUDA use events (resolved in :meth:`flush`)."""
        if self.use_cuda and cat == "compute":
            import torch

            start_ev, end_ev = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            host = time.perf_counter()
            start_ev.record()
            yield
            end_ev.record()
            self._pending.append((cat, name, host, start_ev, end_ev))
            return
        t = time.perf_counter()
        yield
        self._add(cat, name, t, time.perf_counter() - t)

    def record(self, cat: str, name: str, start_s: float, dur_s: float) -> None:
        """Add a span timed by the caller (``time.perf_counter`` seconds)."""
        self._add(cat, name, start_s, dur_s)

    def flush(self) -> None:
        """Resolve CUDA-event spans (call after ``torch.cuda.synchronize()``)."""
        for cat, name, host, s, e in self._pending:
            self._add(cat, name, host, s.elapsed_time(e) / 1e3)
        self._pending.clear()

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.events))


def merge_traces(paths: list[Path], out: str | Path) -> None:
    """Merge per-rank event lists into one Chrome trace (chrome://tracing, Perfetto)."""
    from system.results import atomic_write_text

    events: list[dict] = []
    for p in paths:
        events += json.loads(Path(p).read_text())
    for r in sorted({e["pid"] for e in events}):
        events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
    atomic_write_text(out, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
