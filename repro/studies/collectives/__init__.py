"""``mode=collectives``: the simulator's all-reduce algorithms against the runtime's on emulated
links, registered before they are measured.

Its options are in ``config.py`` (imported by the mode registry), the step it runs in ``run.py``,
the experiment (setting, predictions, measurement, verdict) in ``experiment.py``; the emulated
network itself is :mod:`system.emulation`'s.
"""
