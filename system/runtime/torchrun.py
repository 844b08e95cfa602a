"""``torchrun`` whose rendezvous stores listen only on the address they advertise.

    python -m system.runtime.torchrun [torchrun options] -m system.runtime.worker SPEC.json

Exactly ``torchrun`` (``torch.distributed.run``), after :func:`system.runtime.store.
bind_to_advertised_address`: the agent's rendezvous store and the workers' store listen on the
``--rdzv-endpoint`` / ``--master-addr`` host and the ``--local-addr`` address, not on every
interface. One host: ``--rdzv-endpoint 127.0.0.1:PORT --local-addr 127.0.0.1`` (what
:func:`system.runtime.launch.run_ranks` passes); several hosts: the host's own address.

The agent gets SIGTERM when its parent dies (torchrun then stops its workers), and its workers,
which call :func:`system.lifeline.die_with_parent`, die with the agent.
"""

from __future__ import annotations

import os
import signal
import sys

from system.lifeline import PARENT_ENV, die_with_parent
from system.runtime.store import bind_to_advertised_address


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run

    die_with_parent(signal.SIGTERM)
    os.environ[PARENT_ENV] = str(os.getpid())  # the workers' parent is this agent
    bind_to_advertised_address()
    run.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
