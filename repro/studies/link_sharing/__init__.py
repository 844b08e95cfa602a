"""``mode=link_sharing``: which of the simulator's link-sharing models predicts exchanges on
emulated links, registered before it is measured.

Its options are in ``config.py`` (imported by the mode registry), the step it runs in ``run.py``,
the experiment (setting, predictions, measurement, verdict) in ``experiment.py``; the emulated
network itself is :mod:`system.emulation`'s.
"""
