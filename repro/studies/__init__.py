"""Studies: each a mode of ``repro/run.py`` (its config in :mod:`repro.config.studies`)."""
