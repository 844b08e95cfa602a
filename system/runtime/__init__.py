"""The torch.distributed runtime (paper §3.5): GPT stages, GPipe pipeline, data parallel, launch.

Only this package imports ``torch.distributed``. Importing it is cheap: submodules load torch
when they are imported themselves.
"""
