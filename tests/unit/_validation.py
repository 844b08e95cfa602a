"""Shared pieces of the validation tests: a small setting, a flat compute profile for it, and
the predictions document made from them."""

from __future__ import annotations

from repro.studies.validation.predict import predict_setting
from repro.studies.validation.profile import shape_key
from repro.studies.validation.settings import Setting

BASE = {
    "name": "s1",
    "case": "5",
    "devices": [0, 8, 24, 40],
    "pp": 2,
    "dp": 2,
    "global_batch_size": 8,
    "hidden_size": 128,
    "bandwidth_scale": 0.1,
}


def setting(**kw) -> Setting:
    return Setting.from_dict({**BASE, **kw})


def profile(s: Setting, fwd=0.01, bwd=0.02, opt=0.005) -> dict:
    return {
        "profile_version": 1,
        "entries": {
            shape_key(s): {"fwd_s": [fwd] * s.pp, "bwd_s": [bwd] * s.pp, "opt_s": [opt] * s.pp}
        },
    }


def predictions(s: Setting) -> dict:
    return {
        "prediction_version": 1,
        "settings": [s.to_dict()],
        "predictions": predict_setting(s, profile(s), schedule_trials=20),
    }
