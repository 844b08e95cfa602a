"""Studies: the science beyond the paper's grid, each a folder (``config.py`` with its options,
``run.py`` with its work) and a mode of ``repro/run.py``. Checks of the harness itself are in
:mod:`repro.checks`."""
