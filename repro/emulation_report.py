"""Entry point kept for scripts: ``python repro/emulation_report.py DIR`` runs
:func:`repro.report.emulation.main` (same as ``python -m repro.report.emulation DIR``)."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from repro.report.emulation import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
