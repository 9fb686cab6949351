"""Exact backbone retraining by slices ([SISA]) and the certified head on its features (sliced_resolve).

Tolerances: the backbone is compared bitwise (``torch.equal``): a retrain replays the same float32 operations as a
fresh training on the retained slices (same start state, samples, order, seeds, kernels and threads, on the CPU), so
any difference is a bug, not rounding. Features are float64 and compared to 1e-12 relative (the same forward pass,
possibly in other batch splits: float64 rounding is ~1e-16 relative per operation); the head against the optimum
solved to a gradient norm of 1e-13 (its own distance below 1e-13 / l2), within the recorder's certified radius.
"""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from helpers import quiet_trainer
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_unlearn import ForgetRequest, IndexedDataset, Ledger, ReleaseConfig
from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.callbacks.slices import SlicedBackbone, sisa_epochs
from lightning_unlearn.functional import convex
from lightning_unlearn.models import float64_forward
from lightning_unlearn.unlearners.sliced import SlicedResolveUnlearner

L2, RADIUS, N, SEEN = 1e-2, 1e-4, 360, 270  # the backbone learns ids 0..269, the head all 360


def digits() -> IndexedDataset:
    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x[:N] / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    return IndexedDataset(TensorDataset(images, torch.tensor(y[:N], dtype=torch.long)))


class DigitsCNN(L.LightningModule):
    """A user's CNN: BatchNorm, label-smoothed loss, SGD with momentum, trained end to end."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(
            nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 36, 16), nn.ReLU()
        )
        self.classifier = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.trunk(x))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch[0]), batch[1], label_smoothing=0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class HeadModel(L.LightningModule):
    """The frozen trunk and the certified head (solved by the recorder)."""

    def __init__(self, trunk: nn.Module) -> None:
        super().__init__()
        self.trunk = copy.deepcopy(trunk).requires_grad_(False)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x))

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return None


def sliced(data: IndexedDataset, slices: int | list = 3, **kwargs) -> SlicedBackbone:
    backbone = SlicedBackbone(DigitsCNN(), slices=slices, epochs=[1, 2, 1], trunk="trunk", batch_size=32, **kwargs)
    backbone.fit(data)
    return backbone


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def without(slices: list[torch.Tensor], ids: list[int]) -> list[torch.Tensor]:
    return [s[~torch.isin(s, torch.tensor(ids))] for s in slices]


def in_slice(backbone: SlicedBackbone, k: int) -> int:
    return int(backbone.stages.slices[k - 1][0])


def test_forgetting_equals_training_from_scratch_on_the_retained_slices():
    data = digits()
    backbone = sliced(data)
    assert sorted(torch.cat(backbone.slice_ids).tolist()) == list(range(N))
    before = backbone.stages
    trained = {k: v.clone() for k, v in before.states[-1].items()}
    ids = [in_slice(backbone, 2), in_slice(backbone, 3)]
    result = backbone.forget(torch.tensor(ids), data)
    assert (result.first_stage, result.retrained) == (2, 2) and result.seconds > 0
    # stages 2 and 3 passed 2 epochs over slices 1..2 and 1 epoch over slices 1..3 (the two ids removed)
    sizes = [len(s) for s in result.stages.slices]
    assert result.samples == 2 * (sizes[0] + sizes[1]) + sum(sizes) == backbone.cost(2) and sum(sizes) == N - 2
    # a fresh SlicedBackbone on the retained data only (other rows, same ids) with the same slices and seeds
    retained = Subset(data, [i for i in range(N) if i not in ids])
    fresh = sliced(retained, slices=without(before.slices, ids))
    assert all(states_equal(a, b) for a, b in zip(backbone.stages.states, fresh.stages.states))
    assert states_equal(backbone.module.state_dict(), fresh.module.state_dict())
    # stages before the first slice holding a forgotten id are kept as they were; the retrain changed the rest
    assert backbone.stages.states[:2] == before.states[:2]
    assert not states_equal(result.stages.states[-1], trained)
    assert all(not bool(t.any()) for state in before.states[2:] for t in state.values())  # overwritten


def test_stage_epochs_and_sisa_schedule():
    # [SISA]'s released schedule: a = 2E/(S+1) epochs per stage on average, the costs summing to about E epochs
    assert sisa_epochs(8, 4) == [3, 3, 3, 3]
    assert sisa_epochs(10, 4) == [4, 4, 4, 4] and sisa_epochs(3, 4) == [1, 1, 1, 1] and sum(sisa_epochs(1, 4)) == 1
    with pytest.raises(ValueError, match="one per slice"):
        SlicedBackbone(DigitsCNN(), slices=3, epochs=[1, 1])
    with pytest.raises(ValueError, match="max_epochs"):
        SlicedBackbone(DigitsCNN(), trainer_kwargs={"max_epochs": 3})
    with pytest.raises(ValueError, match="strategy"):
        SlicedBackbone(DigitsCNN(), trainer_kwargs={"strategy": "ddp"})
    with pytest.raises(ValueError, match="disjoint"):
        SlicedBackbone(DigitsCNN(), slices=[[1, 2], [2, 3]])
    with pytest.raises(TypeError, match="configure_optimizers"):
        SlicedBackbone(nn.Linear(2, 2))  # type: ignore[arg-type]  # a plain module has no recipe


def test_bad_input_changes_nothing():
    data = digits()
    backbone = sliced(data)
    stages = backbone.stages
    saved = backbone.state_dict()
    weights = copy.deepcopy(backbone.module.state_dict())
    with pytest.raises(ValueError, match="never trained on sample ids \\[10000\\]"):
        backbone.forget(torch.tensor([in_slice(backbone, 1), 10_000]), data)
    lacking = Subset(data, range(N - 1))  # a retained sample is missing
    with pytest.raises(ValueError, match=f"lacks 1 sample ids.*{N - 1}"):
        backbone.forget(torch.tensor([in_slice(backbone, 1)]), lacking)
    with pytest.raises(ValueError, match="already trained"):
        backbone.fit(data)
    assert backbone.stages is stages and states_equal(backbone.module.state_dict(), weights)
    assert all(states_equal(a, b) for a, b in zip(saved["states"], backbone.state_dict()["states"]))
    # an id forgotten once is unknown afterwards
    forgotten = in_slice(backbone, 3)
    backbone.forget(torch.tensor([forgotten]), data)
    with pytest.raises(ValueError, match="already"):
        backbone.forget(torch.tensor([forgotten]), data)


def test_state_dict_round_trip_and_refusals(tmp_path):
    data = digits()
    backbone = sliced(data)
    torch.save(backbone.state_dict(), tmp_path / "sliced.pt")
    restored = SlicedBackbone(DigitsCNN(), slices=3, epochs=[1, 2, 1], trunk="trunk", batch_size=32)
    restored.load_state_dict(torch.load(tmp_path / "sliced.pt"))
    assert states_equal(restored.module.state_dict(), backbone.module.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(restored.slice_ids, backbone.slice_ids))
    # the restored one forgets exactly as the original does
    ids = torch.tensor([in_slice(backbone, 2)])
    assert states_equal(restored.forget(ids, data).stages.states[-1], backbone.forget(ids, data).stages.states[-1])
    state = backbone.state_dict()
    other = SlicedBackbone(DigitsCNN(), slices=3, epochs=[1, 2, 1], trunk="trunk", batch_size=32, seed=1)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)
    fresh = SlicedBackbone(DigitsCNN(), slices=3, epochs=[1, 2, 1], trunk="trunk", batch_size=32)
    initial = copy.deepcopy(fresh.module.state_dict())
    with pytest.raises(ValueError, match="3 states, expected 3 and 4"):
        fresh.load_state_dict({**state, "states": state["states"][:3]})
    with pytest.raises(ValueError, match="disjoint"):
        fresh.load_state_dict({**state, "slices": [state["slices"][0]] * 3})
    assert not fresh.fitted and states_equal(fresh.module.state_dict(), initial)
    # among a Trainer's callbacks, a Lightning checkpoint carries it (under its state key)
    trainer = quiet_trainer([backbone])
    trainer.strategy.connect(backbone.module)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    fresh.load_state_dict(torch.load(tmp_path / "run.ckpt", weights_only=False)["callbacks"][backbone.state_key])
    assert states_equal(fresh.module.state_dict(), backbone.module.state_dict())


# -- the certified head on the sliced backbone --------------------------------------------------------------------
def head_on_sliced(data: IndexedDataset, **strategy_kwargs):
    """A backbone trained by 3 slices on ids 0..SEEN-1; the certified head on all N samples' features."""
    backbone = sliced(data, slices=[torch.arange(k, SEEN, 3) for k in range(3)])
    model, recorder = HeadModel(backbone.module.trunk), SoftmaxHeadRecorder(L2, radius=RADIUS, backbone="trunk")
    quiet_trainer([recorder]).fit(model, DataLoader(data, batch_size=64))
    return model, recorder, backbone, SlicedResolveUnlearner(model, recorder, backbone, **strategy_kwargs)


def exact_head(recorder: SoftmaxHeadRecorder) -> torch.Tensor:
    return convex.solve(recorder.problem(), torch.zeros_like(recorder.solved_head), 1e-13).W


def test_request_the_backbone_saw_retrains_it_and_resolves_the_head():
    data = digits()
    model, recorder, backbone, strategy = head_on_sliced(data)
    slices = backbone.slice_ids
    forgotten = [int(slices[1][0]), 300]  # one sample of slice 2 (the backbone's), one only the head learned
    result = strategy.forget(ForgetRequest.samples(forgotten), data=data)
    extra = result.extra
    assert extra["backbone_retrained"] and extra["backbone_forgotten"] == 1
    assert (extra["backbone_first_stage"], extra["backbone_stages_retrained"]) == (2, 2)
    assert extra["backbone_seconds"] > 0
    # the backbone equals a fresh one trained on the retained slices; the module's trunk holds it
    fresh = sliced(Subset(data, [i for i in range(SEEN) if i not in forgotten]), slices=without(slices, forgotten))
    assert states_equal(backbone.module.state_dict(), fresh.module.state_dict())
    assert states_equal(model.trunk.state_dict(), fresh.module.trunk.state_dict())
    # every retained row's features are the fresh trunk's (float64), and the head is within radius of their optimum
    rows = recorder.row_ids
    assert sorted(rows.tolist()) == [i for i in range(N) if i not in forgotten]
    x = torch.stack([data[int(i)][0] for i in rows])
    expected = torch.cat([float64_forward(fresh.module.trunk, x), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    torch.testing.assert_close(recorder.feature_rows, expected, rtol=1e-12, atol=1e-12)
    assert float((recorder.solved_head - exact_head(recorder)).norm()) <= RADIUS
    cert = result.certificate
    assert cert.method == "sliced_resolve" and cert.certified and cert.bounds["sensitivity"] == RADIUS
    assert cert.statement.startswith("backbone: exact, stages 2..3 retrained")
    assert any("SlicedBackbone" in a for a in cert.assumptions)
    assert not any("never trained on samples that can be forgotten" in a for a in cert.assumptions)


def test_request_the_backbone_never_saw_leaves_it_and_needs_no_data():
    data = digits()
    model, recorder, backbone, strategy = head_on_sliced(data, release=ReleaseConfig(noise=False))
    stages, trunk = backbone.stages, copy.deepcopy(model.trunk.state_dict())
    result = strategy.forget(ForgetRequest.samples([SEEN + 5, SEEN + 9]))  # only the head learned them
    assert backbone.stages is stages and states_equal(model.trunk.state_dict(), trunk)
    assert not result.extra["backbone_retrained"] and result.extra["backbone_stages_retrained"] == 0
    assert float((recorder.solved_head - exact_head(recorder)).norm()) <= RADIUS
    assert result.certificate.statement.startswith("backbone: never trained on these samples")
    assert not any("never trained on samples that can be forgotten" in a for a in result.certificate.assumptions)


def test_bad_request_changes_nothing(tmp_path):
    data = digits()
    ledger = Ledger(tmp_path / "ledger.jsonl")
    model, recorder, backbone, strategy = head_on_sliced(data, ledger=ledger)
    stages = backbone.stages
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in recorder.state_dict().items()}
    weights = copy.deepcopy(model.state_dict())
    seen = int(backbone.slice_ids[0][0])
    with pytest.raises(ValueError, match="needs the training set: pass data="):
        strategy.forget(ForgetRequest.samples([seen]))
    with pytest.raises(ValueError, match="reads every retained sample from data="):
        strategy.forget(ForgetRequest.samples([seen]), data=Subset(data, range(N - 1)))
    with pytest.raises(ValueError):
        strategy.forget(ForgetRequest.samples([10_000]), data=data)
    changed = copy.deepcopy(data)
    changed.dataset.tensors[0][5] += 1.0  # another input under id 5: refused by the learned fingerprints
    with pytest.raises(ValueError, match="reads every retained sample"):
        strategy.forget(ForgetRequest.samples([seen]), data=changed)
    assert backbone.stages is stages and len(ledger) == 0
    assert states_equal(model.state_dict(), weights)
    after = recorder.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items() if isinstance(v, torch.Tensor))
    # a module whose trunk is not the sliced backbone's is refused
    with torch.no_grad():
        model.trunk[0].weight.add_(1e-3)
    with pytest.raises(ValueError, match="backbone 'trunk'.* differ from those recorded"):  # the head's features
        SlicedResolveUnlearner(model, recorder, backbone)


def contains(t: torch.Tensor, row: torch.Tensor) -> bool:
    """Whether ``row``'s values appear contiguously anywhere in the floating tensor ``t`` (flattened, in its dtype)."""
    if not t.is_floating_point():
        return False
    flat, row = t.detach().flatten(), row.flatten().to(t.dtype)
    return len(flat) >= len(row) and bool((flat.unfold(0, len(row), 1) == row).all(1).any())


def test_forgotten_sample_survives_nowhere():
    data = digits()
    model, recorder, backbone, strategy = head_on_sliced(data)
    u = int(backbone.slice_ids[0][3])  # in slice 1: every stage is retrained
    x_u = data[u][0]
    row_u = recorder.feature_rows[recorder.rows_of(torch.tensor([u]))][0].clone()
    old_rows, old_stages = recorder.feature_rows, backbone.stages
    strategy.forget(ForgetRequest.samples([u]), data=data)
    states = [recorder.state_dict(), backbone.state_dict(), model.state_dict()]
    tensors = [t for s in states for t in _tensors(s)]
    assert not any(contains(t, x_u) or contains(t, row_u) for t in tensors)
    assert u not in recorder.row_ids.tolist() and u not in torch.cat(backbone.slice_ids).tolist()
    assert not bool(old_rows.abs().sum())  # the replaced feature matrix was overwritten
    assert all(not bool(t.any()) for state in old_stages.states[1:] for t in state.values())
    assert states_equal(backbone.stages.states[0], old_stages.states[0])  # the initial weights saw nothing


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def test_ddp_head_fit_then_a_backbone_retrain_on_every_rank(tmp_path):
    # Under DDP each rank trains and retrains the same stages in its own process: the trunk equals the one-process
    # run bitwise, each rank recomputes the features of the retained rows it holds (rank 0's saved state gathers
    # every row), and rank 0's head and noise are published on both
    from pathlib import Path

    from helpers import run_script

    script = Path(__file__).parent / "scripts" / "ddp_sliced.py"
    run_script(script, tmp_path / "ddp.pt", 2)
    run_script(script, tmp_path / "single.pt", 1)
    single = torch.load(tmp_path / "single.rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"ddp.rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[1]["recorder"]["row_shard"] == [1, 2] and len(ranks[1]["recorder"]["row_ids"]) < len(
        ranks[0]["recorder"]["row_ids"]
    )
    ranks[1]["recorder"] = {**ranks[0]["recorder"], "W": ranks[1]["recorder"]["W"]}  # its head; rank 0's rows
    for rank in ranks:
        assert rank["forgotten"] == single["forgotten"] and rank["extra"]["backbone_first_stage"] == 2
        assert states_equal(rank["backbone"], single["backbone"])
        trunk = {k: v for k, v in rank["published"].items() if k.startswith("trunk.")}
        assert states_equal(trunk, {k: v for k, v in single["published"].items() if k.startswith("trunk.")})
        ddp, one = rank["recorder"], single["recorder"]
        mine, order = ddp["row_ids"].argsort(), one["row_ids"].argsort()
        assert torch.equal(ddp["row_ids"][mine], one["row_ids"][order]) and single["forgotten"] not in ddp["row_ids"]
        torch.testing.assert_close(ddp["feature_rows"][mine], one["feature_rows"][order], rtol=1e-12, atol=1e-12)
        assert float((ddp["W"] - one["W"]).norm()) <= 2 * RADIUS  # both within radius of one optimum
    assert states_equal(ranks[0]["published"], ranks[1]["published"])  # rank 0's head and noise
