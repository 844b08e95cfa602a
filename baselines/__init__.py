"""The baselines (Megatron-LM, DeepSpeed): their performance models, op orders and real runs.

Importing the package registers each framework's pipeline op order with the simulator's event
replay (``schedule="megatron"`` / ``"deepspeed"``, :mod:`system.simulator.replay`).
"""

from baselines.deepspeed import schedule as _deepspeed_schedule  # noqa: F401
from baselines.megatron import schedule as _megatron_schedule  # noqa: F401
