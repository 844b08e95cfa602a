"""Former home of the baseline workers' rank-side helpers, now :mod:`baselines.worker` (both
frameworks use them). Kept as an alias while the workers still import ``baselines.megatron.common``.
"""

from baselines.worker import *  # noqa: F403
from baselines.worker import __all__  # noqa: F401
