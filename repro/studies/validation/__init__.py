"""Out-of-sample validation of the simulator against emulated runs, registered in advance.

Four steps, each a mode of ``repro/run.py`` (``results/validation/FINDINGS.md`` lists the
commands of every round):

1. ``mode=profile`` (:mod:`~repro.studies.validation.profile`) or, in situ, ``mode=calibrate``
   (:mod:`~repro.studies.validation.calibrate`): a short compute profile of every stage shape
   the settings use, in a run of its own (not a scored run), written to a JSON file;
2. ``mode=predict`` (:mod:`~repro.studies.validation.predict`): the simulator's iteration time
   per setting and system from that profile, with the git revision, committed before any
   measurement;
3. ``mode=measure`` (:mod:`~repro.studies.validation.measure`): each setting emulated three
   times, fresh namespaces and re-verified links per repeat, the registered layouts only;
4. ``mode=score`` (:mod:`~repro.studies.validation.score`): per-row error, MAPE, Kendall τ,
   ratio errors, variance; it refuses predictions whose registration commit is not an older
   ancestor of the measurement's (:mod:`~repro.studies.validation.registration`).
"""
