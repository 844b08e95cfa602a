"""``mode=probe_inputs``'s options: the bad and edge inputs run on two commits."""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.base import RunConfig, register_mode
from repro.config.options import option

__all__ = ["ProbeInputsConfig"]


@dataclass
@register_mode("probe_inputs")
class ProbeInputsConfig(RunConfig):
    """Every bad or edge input of the review on two commits; the table of what each did."""

    before: str = option(
        "370986d", "the commit before (the main commit the hostile-input review was run on)"
    )
    after: str = option("HEAD", "the commit after")
    only: str | None = option(None, "run the probes whose name contains this")
    lock_dir: str | None = option(
        None,
        "a shared machine's lock folder: each probe holds dtfm-cpu.lock shared, an emulating "
        "one dtfm-netns.lock exclusive first",
    )
