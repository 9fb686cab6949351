"""torchvision resnet18 (a user's LightningModule with BatchNorm, its own loss and SGD) on 32x32 FakeData:
every recorder fits and every registered method executes a request (benchmarks/own_model.py, tiny)."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from lightning_unlearn_bench.registry import available_methods

pytestmark = pytest.mark.slow

SPEC = importlib.util.spec_from_file_location("own_model", Path(__file__).parent.parent / "benchmarks" / "own_model.py")
own_model = importlib.util.module_from_spec(SPEC)
sys.modules["own_model"] = own_model
SPEC.loader.exec_module(own_model)


def test_every_registered_method_forgets_on_a_user_resnet18():
    data = own_model.fake_data(32)  # one batch of 64: one step per epoch
    args = argparse.Namespace(epochs=1, track=4, hessian=True)
    _, rows, methods = own_model.build_all(data, args)
    assert {name for name, *_ in rows} >= {
        "SampleRecorder",
        "SAFERecorder",
        "CCLRecorder",
        "AnalyticRecorder",
    }
    ran = {}
    for name, run in methods:
        result = run()
        requested = set(own_model.FORGET.sample_ids) if name != "hf" else {3}  # HF tracks ids 0-3
        assert set(result.removed_ids.tolist()) == requested, name
        ran[name] = result.certificate
    assert set(ran) == set(available_methods())
    assert ran["acu"].exact and ran["retrain"].exact
