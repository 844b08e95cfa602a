"""A launcher worker's warm-up (``ModeSpec.warm``): it loads what a first job would and leaves
nothing behind."""

import importlib
import os

import pytest

from repro.config import MODES


@pytest.mark.slow
def test_simulate_warm_writes_nothing_and_loads_the_kernels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay = importlib.import_module("system.simulator.replay")  # the module, not the function
    before = replay._replay_cached.cache_info().currsize
    MODES["simulate"].function("warm")()
    assert replay._replay_cached.cache_info().currsize > before  # a pipeline was replayed
    assert os.listdir(tmp_path) == []  # no results, no outputs folder


def test_every_warm_hook_names_a_function():
    for spec in MODES.values():
        if spec.warm is not None:
            assert callable(spec.function("warm")), spec.name
