"""[HF] App. D.3's face datasets from files on disk: LFW people (the 29 with 30-100 images) and CelebA's Male attribute,
written by the fake-data writer in their real layouts and read by torchvision's ``LFWPeople`` and ``CelebA``; stable
sample ids, seeded size caps drawn before any image is read, missing files named, the full scales' data loadable."""

import shutil

import pytest
import torch
from torchvision import transforms

from lightning_unlearn_bench import DatasetNotFoundError, load_splits
from lightning_unlearn_bench.datasets import DATASETS, FACES, CelebAGender, LFWFaces, load_dataset
from lightning_unlearn_bench.fake_data import CELEBA_ATTRIBUTES, write_fake_dataset
from lightning_unlearn_bench.papers import get_config
from lightning_unlearn_bench.repro import classifier


@pytest.fixture(scope="module")
def lfw_root(tmp_path_factory):
    # 29 people of 6 images (5 train, 1 held out), one of 1 and one of 101 images
    return write_fake_dataset("lfw-people", tmp_path_factory.mktemp("lfw"), per_class=5, test_per_class=1)


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory):
    return write_fake_dataset("celeba-gender", tmp_path_factory.mktemp("celeba"), per_class=6, test_per_class=3)


def test_lfw_keeps_the_people_with_enough_images_and_holds_out_every_fifth(lfw_root):
    train = LFWFaces(lfw_root, images_per_person=(3, 100), transform=transforms.ToTensor())
    test = LFWFaces(lfw_root, train=False, images_per_person=(3, 100))
    assert train.classes == test.classes == sorted(train.classes)
    assert len(train.classes) == FACES["lfw-people"].num_classes  # "Fake_Once" (1) and "Fake_Often" (101) dropped
    assert not {"Fake_Once", "Fake_Often"} & set(train.classes)
    assert torch.bincount(torch.tensor(train.targets)).tolist() == [5] * 29
    assert torch.bincount(torch.tensor(test.targets)).tolist() == [1] * 29
    assert not set(train.rows) & set(test.rows)  # rows of LFWPeople's list: the two sets are disjoint
    held_out = [train.people.data[r] for r in test.rows]
    assert all(path.endswith("_0005.jpg") for path in held_out)  # the fifth image of each 6-image person
    x, y = train[0]
    assert x.shape == (3, 250, 250) and y == train.targets[0]
    assert len(LFWFaces(lfw_root, images_per_person=(3, 101)).classes) == 30  # now "Fake_Often" is kept
    with pytest.raises(ValueError, match="has 7 to 8 images"):
        LFWFaces(lfw_root, images_per_person=(7, 8))


def test_lfw_under_hfs_selection_needs_thirty_images_per_person(lfw_root):
    with pytest.raises(ValueError, match="has 30 to 100 images"):
        load_dataset("lfw-people", lfw_root)


def test_celeba_labels_are_the_male_attribute_of_the_train_and_test_partitions(celeba_root):
    train, test = CelebAGender(celeba_root), CelebAGender(celeba_root, train=False)
    assert (len(train), len(test)) == (12, 6)  # the two validation images are in neither
    lines = (celeba_root / "celeba" / "list_attr_celeba.txt").read_text().splitlines()
    male = CELEBA_ATTRIBUTES.index("Male")
    written = {row.split()[0]: int(row.split()[1 + male] == "1") for row in lines[2:]}
    assert train.targets == [written[f] for f in train.celeba.filename]
    assert test.targets == [written[f] for f in test.celeba.filename]
    assert sorted(set(train.targets)) == [0, 1]
    x, y = load_dataset("celeba-gender", celeba_root)[3]
    assert x.shape == FACES["celeba-gender"].in_shape and x.dtype == torch.float32 and y == train.targets[3]


def test_size_caps_draw_subsets_with_stable_ids(celeba_root):
    full = load_splits("celeba-gender", celeba_root)
    small = load_splits("celeba-gender", celeba_root, train_size=5, test_size=2, seed=3)
    assert (len(full.train), len(full.test), len(small.train), len(small.test)) == (12, 6, 5, 2)
    assert torch.equal(full.train.ids, torch.arange(12))
    for i in small.train.ids.tolist():  # same id, same image and label
        x, y, j = small.train[small.train.ids.tolist().index(i)]
        assert j == i and torch.equal(x, full.train[i][0]) and y == full.train[i][1]
    assert set(small.test.ids.tolist()) <= set(range(6))
    with pytest.raises(ValueError, match="train_size must be positive"):
        load_splits("celeba-gender", celeba_root, train_size=0)


@pytest.mark.parametrize("name", sorted(FACES))
def test_missing_face_files_are_named(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as err:
        load_splits(name, tmp_path)
    assert all(f in str(err.value) for f in DATASETS[name].files) and "never downloads" in str(err.value)
    write_fake_dataset(name, tmp_path, per_class=1)
    gone = FACES[name].files[-1]
    (tmp_path / gone).unlink()
    with pytest.raises(DatasetNotFoundError, match="lacks " + gone):
        load_splits(name, tmp_path)


@pytest.mark.parametrize(("label", "per_class", "test_per_class"), [("LFW", 24, 6), ("CelebA", 4, 2)])
def test_the_full_scales_read_their_dataset_from_fake_files(tmp_path, label, per_class, test_per_class):
    setup = next(s for s in get_config("hf-table6").setups if s.label.startswith(label))
    scale, spec = setup.full, DATASETS[setup.full.dataset]
    root = write_fake_dataset(scale.dataset, tmp_path, per_class=per_class, test_per_class=test_per_class)
    splits = load_splits(scale.dataset, root, train_size=scale.train_size, test_size=scale.test_size)
    n = spec.num_classes
    assert (len(splits.train), len(splits.test)) == (n * per_class, n * test_per_class)  # fewer than the caps
    x, y, _ = splits.train[0]
    assert x.shape == spec.in_shape and 0 <= y < n
    with torch.no_grad():  # the scale's model takes the images (ImageNet stem at these sizes); no training
        net = classifier(scale.model, n, spec.in_shape, scale.width).eval()
        assert net(x[None]).shape == (1, n)
    assert net.conv1.kernel_size == (7, 7)
    shutil.rmtree(root)
