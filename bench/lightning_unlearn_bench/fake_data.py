"""Tiny stand-ins for the file benchmarks' datasets, written in each dataset's real on-disk format.

Tests (and smoke runs on machines without the datasets) write a few images per class with
:func:`write_fake_dataset` and load them with the real reading code
(:func:`~lightning_unlearn_bench.datasets.load_benchmark`). Each class's images are noisy copies
of a seeded class prototype, so a model can learn them.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

from lightning_unlearn_bench.datasets import BENCHMARKS, LFW_IMAGES_PER_PERSON, dataset_spec

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
#: CelebA's 40 attributes, in ``list_attr_celeba.txt``'s order
CELEBA_ATTRIBUTES = (
    "5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair Blond_Hair "
    "Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup High_Cheekbones Male "
    "Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks "
    "Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace "
    "Wearing_Necktie Young"
).split()
#: the faces' images are drawn at this (H, W, C) and resized to the real files' sizes (LFW 250x250, CelebA 218x178)
_FACE_DRAW = {"lfw-people": (25, 25, 3), "celeba-gender": (27, 22, 3)}


def fake_images(
    num_classes: int, per_class: int, shape: tuple[int, ...], rng: np.random.Generator, prototypes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` uint8 images of ``shape`` per class (noisy ``prototypes[c]``), shuffled, and their labels."""
    labels = rng.permutation(np.repeat(np.arange(num_classes), per_class))
    noise = rng.integers(0, 256, size=(len(labels), *shape))
    images = (0.6 * prototypes[labels] + 0.4 * noise).astype(np.uint8)
    return images, labels


def write_fake_dataset(
    name: str, root: str | Path, *, per_class: int, test_per_class: int | None = None, seed: int = 0
) -> Path:
    """Write benchmark ``name``'s dataset under ``root`` in its real format, ``per_class`` training images per class.

    Formats (what torchvision's readers, and :class:`~lightning_unlearn_bench.datasets.TinyImageNet`, read):
    CIFAR-10's python pickles ``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``;
    CIFAR-100's ``cifar-100-python/train``, ``test``, ``meta`` (fine and coarse labels); SVHN's MATLAB
    files ``svhn/train_32x32.mat``, ``test_32x32.mat`` (``X`` of shape (32, 32, 3, N), ``y`` with 10 for
    the digit 0); (Fashion-)MNIST's raw idx files ``MNIST/raw/*-idx?-ubyte`` (``FashionMNIST/raw/``); Tiny-ImageNet's
    ``tiny-imagenet-200`` folders of JPEGs with ``wnids.txt``, ``words.txt`` and ``val/val_annotations.txt``;
    LFW's ``lfw-py/lfw/<name>/<name>_<k>.jpg`` (250x250) with ``people.txt`` (10 folds) and ``lfw-names.txt``;
    CelebA's ``celeba/img_align_celeba/*.jpg`` (178x218) with its five list files (train, two validation and
    test images in ``list_eval_partition.txt``). Every class of the real dataset is present (CIFAR-100: 100,
    Tiny-ImageNet: 200, LFW: the 29 kept people).

    LFW has no test files: each of its 29 people gets ``per_class + test_per_class`` images, of which the reader
    (:class:`~lightning_unlearn_bench.datasets.LFWFaces`) holds out every fifth, and it keeps only people
    with 30 to 100 images (:data:`~lightning_unlearn_bench.datasets.LFW_IMAGES_PER_PERSON`), so fewer images
    suit ``LFWFaces`` with a lower ``images_per_person``. Two more people are written that the selection must
    drop: one with a single image and one with one image more than the maximum.

    Args:
        name: one of :data:`~lightning_unlearn_bench.datasets.DATASETS`.
        root: the folder to write into (created if needed).
        per_class: training images per class (at least 1).
        test_per_class: test images per class (``None``: ``max(1, per_class // 2)``).
        seed: seeds the class prototypes and the noise.

    Returns:
        ``root`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: an unknown name, or ``per_class``/``test_per_class`` below 1.
    """
    spec = dataset_spec(name)
    test_per_class = max(1, per_class // 2) if test_per_class is None else test_per_class
    if per_class < 1 or test_per_class < 1:
        raise ValueError(f"per_class and test_per_class must be positive, got {per_class} and {test_per_class}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    c, h, w = spec.in_shape
    layout = {"split-cifar10": (c, h, w), "split-cifar100": (c, h, w), "split-svhn": (h, w, c), **_FACE_DRAW}
    shape = layout.get(name, (h, w, c) if c == 3 else (h, w))
    prototypes = rng.integers(0, 256, size=(spec.num_classes, *shape))
    train = fake_images(spec.num_classes, per_class, shape, rng, prototypes)
    test = fake_images(spec.num_classes, test_per_class, shape, rng, prototypes)
    writer = {
        "split-cifar10": _cifar10,
        "split-cifar100": _cifar100,
        "split-svhn": _svhn,
        "split-mnist": _mnist,
        "split-fmnist": _mnist,
        "split-tinyimagenet": _tinyimagenet,
        "lfw-people": _lfw,
        "celeba-gender": _celeba,
    }[name]
    writer(root, name, train, test)
    return root


def _pickle(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=2)


def _cifar10(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    folder = root / "cifar-10-batches-py"
    batches = np.array_split(np.arange(len(train[1])), 5)
    for i, rows in enumerate(batches, 1):
        _pickle(folder / f"data_batch_{i}", _cifar_batch(train[0][rows], train[1][rows], f"training batch {i} of 5"))
    _pickle(folder / "test_batch", _cifar_batch(*test, "testing batch 1 of 1"))
    _pickle(
        folder / "batches.meta",
        {"label_names": list(CIFAR10_CLASSES), "num_cases_per_batch": len(batches[0]), "num_vis": 3072},
    )


def _cifar_batch(images: np.ndarray, labels: np.ndarray, label: str, key: str = "labels") -> dict[str, object]:
    return {
        "batch_label": label,
        key: [int(v) for v in labels],
        "data": images.reshape(len(images), -1),
        "filenames": [f"fake_{i:05d}.png" for i in range(len(images))],
    }


def _cifar100(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    folder = root / "cifar-100-python"
    for file, (images, labels) in (("train", train), ("test", test)):
        batch = _cifar_batch(images, labels, file, key="fine_labels")
        batch["coarse_labels"] = [int(v) // 5 for v in labels]
        _pickle(folder / file, batch)
    _pickle(
        folder / "meta",
        {
            "fine_label_names": [f"class_{i:03d}" for i in range(100)],
            "coarse_label_names": [f"superclass_{i:02d}" for i in range(20)],
        },
    )


def _svhn(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    from scipy.io import savemat

    folder = root / "svhn"
    folder.mkdir(parents=True, exist_ok=True)
    for file, (images, labels) in (("train_32x32.mat", train), ("test_32x32.mat", test)):
        # X is (32, 32, 3, N); y is (N, 1) with the digit 0 stored as 10
        savemat(folder / file, {"X": images.transpose(1, 2, 3, 0), "y": np.where(labels == 0, 10, labels)[:, None]})


def _idx(path: Path, array: np.ndarray) -> None:
    """The idx format: magic ``0x0000 08 <ndim>`` (unsigned bytes), the big-endian sizes, then the bytes."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _mnist(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    folder = root / ("MNIST" if name == "split-mnist" else "FashionMNIST") / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, (images, labels) in (("train", train), ("t10k", test)):
        _idx(folder / f"{prefix}-images-idx3-ubyte", images)
        _idx(folder / f"{prefix}-labels-idx1-ubyte", labels)


def _tinyimagenet(
    root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]
) -> None:
    from PIL import Image

    folder = root / "tiny-imagenet-200"
    wnids = [f"n{i:08d}" for i in range(BENCHMARKS[name].num_classes)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wnids.txt").write_text("".join(f"{w}\n" for w in reversed(wnids)))  # the real file is unsorted
    (folder / "words.txt").write_text("".join(f"{w}\tfake class {i}\n" for i, w in enumerate(wnids)))
    counts = dict.fromkeys(wnids, 0)
    for image, label in zip(*train, strict=True):
        wnid = wnids[label]
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(images / f"{wnid}_{counts[wnid]}.JPEG", quality=95)
        counts[wnid] += 1
    for wnid, n in counts.items():
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text(
            "".join(f"{wnid}_{i}.JPEG\t0\t0\t63\t63\n" for i in range(n))
        )
    (folder / "val" / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (image, label) in enumerate(zip(*test, strict=True)):
        Image.fromarray(image).save(folder / "val" / "images" / f"val_{i}.JPEG", quality=95)
        lines.append(f"val_{i}.JPEG\t{wnids[label]}\t0\t0\t63\t63\n")
    (folder / "val" / "val_annotations.txt").write_text("".join(lines))


def _jpeg(path: Path, image: np.ndarray, size: tuple[int, int]) -> None:
    """``image`` (H, W, 3) resized to ``size`` (width, height) as a JPEG at ``path``."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image.astype(np.uint8)).resize(size, Image.Resampling.BILINEAR).save(path, quality=90)


def _lfw(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    folder = root / "lfw-py"
    images, labels = np.concatenate([train[0], test[0]]), np.concatenate([train[1], test[1]])
    people = {f"Fake_Person_{c:02d}": images[labels == c] for c in range(dataset_spec(name).num_classes)}
    people["Fake_Once"] = images[:1]  # most LFW people have one image
    people["Fake_Often"] = images[np.arange(LFW_IMAGES_PER_PERSON[1] + 1) % len(images)]
    for person, own in people.items():
        for k, image in enumerate(own, 1):
            _jpeg(folder / "lfw" / person / f"{person}_{k:04d}.jpg", image, (250, 250))
    names = sorted(people)
    (folder / "lfw-names.txt").write_text("".join(f"{n}\t{len(people[n])}\n" for n in names))
    folds = [names[i::10] for i in range(10)]  # people.txt: 10 folds of distinct people
    lines = ["10\n"] + [f"{len(fold)}\n" + "".join(f"{n}\t{len(people[n])}\n" for n in fold) for fold in folds]
    (folder / "people.txt").write_text("".join(lines))


def _celeba(root: Path, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) -> None:
    folder = root / "celeba"
    rng = np.random.default_rng(len(train[1]))
    images = np.concatenate([train[0], train[0][:2], test[0]])
    male = np.concatenate([train[1], train[1][:2], test[1]])
    partition = [0] * len(train[1]) + [1] * 2 + [2] * len(test[1])
    files = [f"{i:06d}.jpg" for i in range(1, len(images) + 1)]
    for file, image in zip(files, images, strict=True):
        _jpeg(folder / "img_align_celeba" / file, image, (178, 218))
    attrs = rng.choice([-1, 1], size=(len(files), len(CELEBA_ATTRIBUTES)))
    attrs[:, CELEBA_ATTRIBUTES.index("Male")] = np.where(male == 1, 1, -1)

    def listing(file: str, header: str | None, rows: list[str]) -> None:
        head = f"{len(rows)}\n{header}\n" if header is not None else ""
        (folder / file).write_text(head + "".join(f"{r}\n" for r in rows))

    listing("list_eval_partition.txt", None, [f"{f} {p}" for f, p in zip(files, partition, strict=True)])
    listing("identity_CelebA.txt", None, [f"{f} {rng.integers(1, 10178)}" for f in files])
    attr_rows = [f + " " + " ".join(f"{v:>2d}" for v in row) for f, row in zip(files, attrs, strict=True)]
    listing("list_attr_celeba.txt", " ".join(CELEBA_ATTRIBUTES), attr_rows)
    listing("list_bbox_celeba.txt", "image_id x_1 y_1 width height", [f"{f}    95  71 226 313" for f in files])
    marks = "lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y rightmouth_x rightmouth_y"
    listing("list_landmarks_align_celeba.txt", marks, [f"{f} 69 109 106 113 77 142 73 152 108 154" for f in files])
