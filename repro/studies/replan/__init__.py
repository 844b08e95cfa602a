"""``mode=replan``: a spot pre-emption trace replayed on a case, re-planning warm vs from scratch.

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
