"""``mode=attribution``: speed-up attribution, a ladder of simulations from Megatron as
launched to ours.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
