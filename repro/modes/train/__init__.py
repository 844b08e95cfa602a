"""``mode=train``: training on this machine's processes: our runtime, or real Megatron / DeepSpeed
(:mod:`~repro.modes.train.baselines`, shared with ``mode=emulate``).

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
