"""``mode=emulate``: training on emulated WAN links of a case, each run beside its prediction.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
