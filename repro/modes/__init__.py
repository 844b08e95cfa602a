"""The modes that run a model, one folder each: ``config.py`` holds the mode's typed options
(registered with :func:`repro.config.register_mode`), ``run.py`` its ``run(cfg)``, which takes
them and returns a summary dict."""
