"""``mode=gpu_check``: our runtime on CUDA (correctness, mixed precision, throughput), then the
GPU calibration study (:mod:`repro.studies.gpu_calibration`).

Its options are in ``config.py`` (imported by the mode registry), its work in ``run.py``.
"""
