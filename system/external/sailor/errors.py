"""One error type and one warning record for every Sailor file: both name the file and the field.

A file that cannot describe a run (a non-numeric time, an unknown GPU type, a plan whose layers
do not make up the model) raises :class:`SailorFormatError`; a known defect that leaves the
prediction unaffected is kept as a :class:`Finding` and reported beside the prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SailorFormatError", "Finding", "number", "positive_int"]


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
    x = float(value)
    if not math.isfinite(x):
        raise SailorFormatError(file, field, f"expected a finite number, got {value!r}")
    if minimum is not None and x < minimum:
        raise SailorFormatError(file, field, f"expected a number >= {minimum:g}, got {value!r}")
    return x


def positive_int(value, file, field: str) -> int:
    """``value`` as an int >= 1 (an integral float such as 4.0 is accepted)."""
    x = number(value, file, field, minimum=1.0)
    if x != int(x):
        raise SailorFormatError(file, field, f"expected a whole number, got {value!r}")
    return int(x)
