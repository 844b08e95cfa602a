"""``python -m repro [mode=NAME] [key=value ...]``: the same entry as ``python repro/run.py``."""

from repro.run import main

main()
