"""File benchmarks: every on-disk format written by the fake-data writer loads with the real readers (torchvision's
and Tiny-ImageNet's folder reader) into Avalanche streams whose items carry stable sample ids; missing files are named;
models build by name; [ACU]'s backbone is pre-trained on the base split and frozen; ``compare --benchmark`` runs."""

import gzip
import shutil

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_unlearn.avalanche import items_with_ids
from lightning_unlearn_bench import (
    BENCHMARKS,
    DatasetNotFoundError,
    backbone_of,
    build_model,
    load_benchmark,
    load_splits,
    pretrain_backbone,
)
from lightning_unlearn_bench.cli import main
from lightning_unlearn_bench.datasets import load_dataset
from lightning_unlearn_bench.fake_data import write_fake_dataset

PER_CLASS, TEST_PER_CLASS = 4, 2


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("datasets")
    for name in BENCHMARKS:
        write_fake_dataset(name, root, per_class=PER_CLASS, test_per_class=TEST_PER_CLASS)
    return root


def _items(dataset):
    x, y, ids = [], [], []
    for batch in DataLoader(dataset, batch_size=256):
        x.append(batch[0])
        y.append(torch.as_tensor(batch[1]))
        ids.append(batch[2])
    return torch.cat(x), torch.cat(y), torch.cat(ids)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_format_loads_into_a_class_incremental_stream_with_sample_ids(fake_root, name):
    spec = BENCHMARKS[name]
    bm = load_benchmark(name, fake_root, base_fraction=0.25, seed=1)
    assert len(bm.train_stream) == spec.n_experiences
    classes, ids = [], []
    targets = torch.as_tensor(load_dataset(name, fake_root).targets)
    for exp in bm.train_stream:
        x, y, i = _items(items_with_ids(exp.dataset))
        assert x.shape[1:] == spec.in_shape and x.dtype == torch.float32
        assert sorted(y.unique().tolist()) == sorted(exp.classes_in_this_experience)
        assert len(exp.classes_in_this_experience) == spec.num_classes // spec.n_experiences
        assert torch.equal(targets[i], y)  # the id is the row of the dataset's training set
        classes += exp.classes_in_this_experience
        ids.append(i)
    ids = torch.cat(ids)
    assert sorted(classes) == list(range(spec.num_classes))
    assert len(ids) == ids.unique().numel() == spec.num_classes * (PER_CLASS - 1)  # a quarter of each class is base
    test = sum(len(exp.dataset) for exp in bm.test_stream)
    assert test == spec.num_classes * TEST_PER_CLASS


def test_base_stream_and_test_are_disjoint_and_ids_are_stable_across_splits(fake_root):
    a = load_splits("split-cifar10", fake_root, base_fraction=0.5, seed=0)
    b = load_splits("split-cifar10", fake_root, base_fraction=0.25, seed=3, per_class=3)
    xa, ya, ia = _items(a.train)
    xb, yb, ib = _items(a.base)
    assert not set(ia.tolist()) & set(ib.tolist())
    assert len(ia) + len(ib) == 10 * PER_CLASS
    assert torch.bincount(yb, minlength=10).tolist() == [PER_CLASS // 2] * 10  # stratified base split
    x2, y2, i2 = _items(b.train)
    assert torch.bincount(y2, minlength=10).max() <= 3
    everything = {int(i): (x, y) for i, x, y in zip(torch.cat([ia, ib]), torch.cat([xa, xb]), torch.cat([ya, yb]))}
    for i, x, y in zip(i2.tolist(), x2, y2):
        assert torch.equal(everything[i][0], x) and everything[i][1] == y  # same id, same sample


@pytest.mark.parametrize(
    ("name", "remove", "named"),
    [
        ("split-cifar10", "cifar-10-batches-py/data_batch_3", "cifar-10-batches-py/data_batch_3"),
        ("split-cifar100", "cifar-100-python/meta", "cifar-100-python/meta"),
        ("split-fmnist", "FashionMNIST/raw/t10k-labels-idx1-ubyte", "FashionMNIST/raw/t10k-labels-idx1-ubyte"),
        ("split-tinyimagenet", "tiny-imagenet-200/train/n00000007", "tiny-imagenet-200/train/n00000007/images/"),
        (
            "split-tinyimagenet",
            "tiny-imagenet-200/val/val_annotations.txt",
            "tiny-imagenet-200/val/val_annotations.txt",
        ),
    ],
)
def test_a_missing_file_is_named(tmp_path, name, remove, named):
    write_fake_dataset(name, tmp_path, per_class=1)
    target = tmp_path / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(DatasetNotFoundError, match="lacks " + named) as err:
        load_benchmark(name, tmp_path)
    assert "never downloads" in str(err.value)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_an_empty_root_names_every_expected_file(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as err:
        load_splits(name, tmp_path)
    assert all(f in str(err.value) for f in BENCHMARKS[name].files)
    assert str(tmp_path) in str(err.value)


def test_compressed_mnist_files_are_named_with_the_fix(tmp_path):
    write_fake_dataset("split-mnist", tmp_path, per_class=1)
    raw = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    raw.with_suffix(".gz").write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    with pytest.raises(DatasetNotFoundError, match=r"found MNIST/raw/train-images-idx3-ubyte.gz: decompress"):
        load_splits("split-mnist", tmp_path)


def test_bad_split_settings_are_refused(fake_root, tmp_path):
    with pytest.raises(ValueError, match="n_experiences=3 must divide split-cifar10's 10 classes"):
        load_benchmark("split-cifar10", tmp_path, n_experiences=3)  # refused before the (missing) files are read
    with pytest.raises(ValueError, match="base_fraction must lie in"):
        load_splits("split-cifar10", fake_root, base_fraction=1.0)
    with pytest.raises(ValueError, match="unknown benchmark 'split-celeba'"):
        load_splits("split-celeba", fake_root)


@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32), (3, 64, 64)])
@pytest.mark.parametrize("name", ["resnet18", "vit_tiny", "cnn", "lenet", "mlp", "linear"])
def test_each_model_builds_and_runs_on_its_input_shape(name, in_shape):
    torch.manual_seed(0)
    model = build_model(name, 7, in_shape).eval()
    x = torch.randn(1, *in_shape)
    assert model(x).shape == (1, 7)
    backbone, dim = backbone_of(model)
    assert backbone(x).shape == (1, dim)
    assert torch.equal(model.fc(backbone(x)), model(x))  # the backbone is the model without its fc


def test_lenet_and_vit_tiny_have_the_parameter_counts_of_the_papers_models():
    def count(model):
        return sum(p.numel() for p in model.parameters())

    assert count(build_model("lenet", 10, (1, 28, 28))) == 61_706  # [HF]'s FMNIST LeNet
    assert count(build_model("vit_tiny", 1000, (3, 224, 224))) == 5_717_416  # ViT-Tiny/16 at 224 ([RBM]: ~5.7M)
    with pytest.raises(ValueError, match="square images"):
        build_model("vit_tiny", 10, (3, 32, 48))


def test_resnet18_cifar_stem_keeps_the_resolution():
    cifar, imagenet = (
        build_model("resnet18", 10, (3, 32, 32)),
        build_model("resnet18", 10, (3, 32, 32), cifar_stem=False),
    )
    assert (cifar.conv1.kernel_size, cifar.conv1.stride) == ((3, 3), (1, 1)) and isinstance(
        cifar.maxpool, torch.nn.Identity
    )
    assert (imagenet.conv1.kernel_size, imagenet.conv1.stride) == ((7, 7), (2, 2))
    x = torch.randn(1, 3, 32, 32)
    stem = torch.nn.Sequential(cifar.conv1, cifar.bn1, cifar.relu, cifar.maxpool)
    assert stem(x).shape[-2:] == (32, 32)
    with pytest.raises(ValueError, match="takes images of shape"):
        build_model("cnn", 10, (784,))


def test_pretrained_backbone_is_frozen_learned_on_base_and_feeds_acu(fake_root):
    from lightning_unlearn.callbacks.acu import AnalyticRecorder
    from lightning_unlearn.models import AnalyticClassifier

    splits = load_splits("split-mnist", fake_root, base_fraction=0.5)
    torch.manual_seed(0)
    model = build_model("mlp", 10, splits.in_shape)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backbone, dim = pretrain_backbone(model, splits.base, epochs=30, lr=0.05, batch_size=8)
    assert dim == 256 and not backbone.training
    assert not any(p.requires_grad for p in backbone.parameters())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    xb, yb, _ = _items(splits.base)
    assert (model(xb).argmax(1) == yb).float().mean() == 1.0  # 20 base samples, learned
    # the frozen backbone under ACU's analytic head, learned on the stream by the recorder
    clf = AnalyticClassifier(backbone, dim, 10)
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[AnalyticRecorder(1e-2)],
    )
    trainer.fit(clf, DataLoader(splits.train, batch_size=16))
    x, y, _ = _items(splits.train)
    assert (clf(x).argmax(1) == y).float().mean() > 0.5  # fake classes are learnable: 20 stream samples


@pytest.mark.slow
def test_compare_runs_on_a_file_benchmark(fake_root, capsys):
    argv = [
        "compare",
        "--data",
        "split-cifar10",
        "--root",
        str(fake_root),
        "--model",
        "cnn",
        "--per_class",
        "4",
        "--experiences",
        "2",
        "--pretrain_epochs",
        "1",
        "--epochs",
        "1",
        "--methods",
        "[acu,finetune]",
        "--requests",
        "[2]",
        "--progress",
        "false",
    ]
    assert main(argv) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "acu" in rows and "finetune" in rows


def test_compare_names_what_a_file_benchmark_lacks(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--data", "split-cifar10", "--progress", "false"])
    assert "reads its files from --root DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--data", "split-cifar100", "--root", str(tmp_path), "--progress", "false"])
    assert "cifar-100-python/train" in capsys.readouterr().err
