"""Benchmarks of the harness: each prints a table measured side by side in one run; their
options are in ``config.py``."""
