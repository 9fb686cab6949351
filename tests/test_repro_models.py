"""The reproduction configs' classifiers: ``cnn2fc`` is [SAFE]'s two-layer CNN (its authors' code) and, unlike the
global-average-pooled ``cnn2``, keeps where the strokes are, so safe-table1's bundled MNIST recipe learns."""

import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_unlearn_bench.datasets import MNIST5k
from lightning_unlearn_bench.models import backbone_of
from lightning_unlearn_bench.papers import get_config
from lightning_unlearn_bench.repro.models import CNN2FC_HIDDEN, classifier


def test_cnn2fc_has_the_layers_of_the_safe_authors_cnn():
    net = classifier("cnn2fc", 10, (1, 28, 28), 16)
    # CaMU's/LAF's CNN: conv 1->16 (5x5), conv 16->32 (5x5), each 2x2-pooled, 32*7*7 -> 256 -> 128 -> 10
    expected = (16 * 25 + 16) + (32 * 16 * 25 + 32) + (32 * 7 * 7 * 256 + 256) + (256 * 128 + 128) + (128 * 10 + 10)
    assert sum(p.numel() for p in net.parameters()) == expected == 449_098
    assert CNN2FC_HIDDEN == (256, 128)
    _, dim = backbone_of(net)  # the harness's backbone/fc split holds
    assert dim == 128 and net(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_cnn2fc_sees_where_a_stroke_is_and_cnn2_does_not():
    """The defect of ``cnn2``: after two 3x3 convolutions the map is averaged over all positions, so a stroke moved by
    two pixels (one pooled cell) inside the frame gives the same output; ``cnn2fc`` flattens the map and tells them
    apart (float64: the two ``cnn2`` outputs differ only by the order of the sums)."""
    torch.manual_seed(0)
    img = torch.zeros(1, 1, 28, 28, dtype=torch.float64)
    img[0, 0, 8:20, 10:12] = 1.0  # a vertical stroke, far from the border
    moved = torch.roll(img, shifts=(2, 2), dims=(2, 3))
    cnn2 = classifier("cnn2", 10, (1, 28, 28), 8).double()
    cnn2fc = classifier("cnn2fc", 10, (1, 28, 28), 8).double()
    with torch.no_grad():
        assert torch.allclose(cnn2(img), cnn2(moved), rtol=0, atol=1e-12)
        assert (cnn2fc(img) - cnn2fc(moved)).abs().max() > 1e-4


def test_the_bundled_safe_mnist_recipe_learns_mnist_5k():
    """safe-table1's bundled MNIST model and step size, one epoch over mnist-5k's 4,000 training digits: far above
    chance (10%; 90% measured). Before the fix the recipe's model (``cnn2``) stayed at 14% after that epoch."""
    scale = get_config("safe-table1").setups[0].bundled
    assert scale is not None and scale.model == "cnn2fc"
    train, test = MNIST5k(train=True), MNIST5k(train=False)
    torch.manual_seed(0)
    net = classifier(scale.model, 10, (1, 28, 28), scale.width)
    opt = torch.optim.SGD(net.parameters(), lr=scale.lr)  # the supervised family's plain SGD
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small convolutions: one thread is several times faster on a shared machine
    try:
        for x, y in DataLoader(train, batch_size=scale.batch_size, shuffle=True):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        with torch.no_grad():
            acc = (net(test.tensors[0]).argmax(1) == test.tensors[1]).double().mean().item()
    finally:
        torch.set_num_threads(threads)
    assert acc > 0.7, acc
