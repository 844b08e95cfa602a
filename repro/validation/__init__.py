"""Out-of-sample validation of the simulator against emulated runs, registered in advance.

Four steps, each a separate command (results/validation/FINDINGS.md lists them):

1. :mod:`repro.validation.profile` — a short compute profile of every stage shape the settings
   use, in its own run (not the validation runs), written to a JSON file;
2. :mod:`repro.validation.predict` (``python repro/run.py mode=predict``) — the simulator's
   iteration time per setting and system from that profile, with the git revision, to be
   committed before any measurement;
3. :mod:`repro.validation.measure` — each setting emulated three times, fresh namespaces and
   re-verified links per repeat, the registered layouts only;
4. :mod:`repro.validation.score` — per-row error, MAPE, Kendall τ, ratio errors, variance; it
   refuses predictions whose registration commit is not an older ancestor of the measurement's
   (the git checks are :mod:`repro.validation.registration`).
"""
