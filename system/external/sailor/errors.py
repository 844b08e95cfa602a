"""One error type and one warning record for every Sailor file: both name the file and the field.

A file that cannot describe a run (a non-numeric time, an unknown GPU type, a plan whose layers
do not make up the model) raises :class:`SailorFormatError`; a known defect that leaves the
prediction unaffected is kept as a :class:`Finding` and reported beside the prediction.

Every file is read by :func:`read_json`: a regular file (no FIFO, device or folder: opened
without blocking, checked on the open handle), at most ``max_bytes`` (checked before reading),
one JSON object.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SailorFormatError",
    "Finding",
    "number",
    "positive_int",
    "read_json",
    "MAX_DATA_BYTES",
    "inside",
]

# The largest file read (the shared profiles file is 0.6 MB); a bigger one is refused unread.
MAX_DATA_BYTES = 32 * 2**20


class SailorFormatError(ValueError):
    """A Sailor file that cannot be used: ``file`` and ``field`` say where."""

    def __init__(self, file: str | Path, field: str, problem: str) -> None:
        self.file, self.field, self.problem = str(file), field, problem
        super().__init__(f"{file}: {field}: {problem}")


@dataclass(frozen=True, slots=True)
class Finding:
    """A recorded warning: a defect of ``file`` at ``field`` that the model works around."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


def number(value, file, field: str, *, minimum: float | None = 0.0) -> float:
    """``value`` as a finite float (bools and strings refused), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SailorFormatError(file, field, f"expected a number, got {value!r}")
    try:
        x = float(value)
    except OverflowError:  # an integer past the float range
        x = math.inf
    if not math.isfinite(x):
        shown = f"{value!r}" if len(repr(value)) <= 24 else f"{repr(value)[:12]}... (too large)"
        raise SailorFormatError(file, field, f"expected a finite number, got {shown}")
    if minimum is not None and x < minimum:
        raise SailorFormatError(file, field, f"expected a number >= {minimum:g}, got {value!r}")
    return x


def positive_int(value, file, field: str) -> int:
    """``value`` as an int >= 1 (an integral float such as 4.0 is accepted)."""
    x = number(value, file, field, minimum=1.0)
    if x != int(x):
        raise SailorFormatError(file, field, f"expected a whole number, got {value!r}")
    return int(x)


def read_json(path, *, max_bytes: int = MAX_DATA_BYTES) -> dict:
    """A JSON object from the regular file ``path`` of at most ``max_bytes``; SailorFormatError
    for anything else (FileNotFoundError kept)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of blocking
    except FileNotFoundError:
        raise
    except OSError as e:
        raise SailorFormatError(p, "(file)", f"not readable ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SailorFormatError(p, "(file)", f"not a regular file ({_kind(st.st_mode)})")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > max_bytes:
            raise SailorFormatError(
                p, "(file)", f"{st.st_size} bytes, over the limit of {max_bytes}"
            )
        try:
            raw = f.read(max_bytes + 1)
        except OSError as e:
            raise SailorFormatError(p, "(file)", f"not readable ({e.strerror})") from None
    if len(raw) > max_bytes:  # grew while we read it
        raise SailorFormatError(p, "(file)", f"over the {max_bytes} bytes a file may have")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise SailorFormatError(p, "(file)", "JSON nested too deeply") from None
    except ValueError as e:
        raise SailorFormatError(p, "(file)", f"not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise SailorFormatError(p, "(top level)", "expected a JSON object")
    return data


def inside(path, folder, what: str) -> None:
    """SailorFormatError unless ``path`` leads to a place inside ``folder`` (a link may point
    within it; one out of it, or a link that does not resolve, is refused)."""
    p = Path(path)
    try:
        target = p.resolve()
        root = Path(folder).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise SailorFormatError(p, "(file)", f"a link that does not resolve ({e})") from None
    if not target.is_relative_to(root):
        raise SailorFormatError(p, "(file)", f"a link to {target}, outside {what}")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
