"""``mode=probe_inputs``: every bad or edge input of the review run on two commits
(the catalogue in ``hostile.py``, what surrounds a probe in ``probe_runs.py``).

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
