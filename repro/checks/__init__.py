"""Checks of the harness itself, each a mode of ``repro/run.py`` or a helper of the tests: the
benchmarks of the harness (``bench/``), the GPU check of our runtime (``gpu_check/``), the
bad-input probes (``probe_inputs/``), what a killed run leaves behind (``leftovers.py``) and a
commit as a folder of its own (``tree.py``). The science is in :mod:`repro.studies`."""
