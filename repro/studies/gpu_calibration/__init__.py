"""GPU calibration of the performance model (run by ``mode=gpu_check calibrate=true``):
:func:`~repro.studies.gpu_calibration.run.run_calibration`."""
