"""The modes that run a model, one module each: ``run(cfg)`` takes the mode's typed config
(:mod:`repro.config.modes`) and returns a summary dict."""
