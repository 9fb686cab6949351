"""Log the attack metrics from a user's validation_step under DDP on 2 CPU processes (gloo) and save their values.

Usage: python ddp_metrics.py OUT.pt [DEVICES]. Run by tests/test_metrics_ddp.py in a subprocess, because
Lightning's "ddp" strategy relaunches the script itself for the other rank. Each sample carries its model
outputs (float64 losses and posteriors, fixed by a seed), so both runs feed the metrics the same numbers and
only the metrics' synchronisation differs.
"""

import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package, before any installed one
from lightning_unlearn.metrics import LossThresholdMIA, MIAUnlearning, OfflineLiRA  # noqa: E402
from lightning_unlearn.progress import QUIET_TRAINER  # noqa: E402

N, C, S = 240, 4, 8  # N even: DistributedSampler pads nothing, so each sample is counted once


def outputs() -> dict[str, torch.Tensor]:
    """Per-sample model outputs: the first 80 samples are forgotten (members for LiRA and MIA-U, targets for the
    loss-threshold attack), the next 80 retained (its members), the last 80 test samples (non-members). Each
    sample has a difficulty (its true label's logit) shared by the target and the shadow models, plus noise;
    the target saw the forgotten and retained samples (their logit is higher by 1)."""
    g = torch.Generator().manual_seed(0)
    role = torch.arange(N) // (N // 3)  # 0 forgotten, 1 retained, 2 test
    labels = torch.randint(0, C, (N,), generator=g)
    difficulty = torch.randn(N, generator=g, dtype=torch.float64)
    one_hot = torch.nn.functional.one_hot(labels, C).double()

    def model(boost: torch.Tensor) -> torch.Tensor:
        noise = 0.5 * torch.randn(N, generator=g, dtype=torch.float64)
        return torch.randn(N, C, generator=g, dtype=torch.float64) + one_hot * (difficulty + noise + boost).view(-1, 1)

    logits = model((role < 2).double())
    shadow = torch.stack([model(torch.zeros(N, dtype=torch.float64)) for _ in range(S)])
    after = logits + torch.where(role == 0, 1.0, 0.05).view(-1, 1) * torch.randn(N, C, generator=g, dtype=torch.float64)
    return {
        "role": role,
        "labels": labels,
        "loss": torch.nn.functional.cross_entropy(logits, labels, reduction="none"),
        "probs": logits.softmax(-1),
        "shadow": shadow.softmax(-1),
        "before": (logits + 0.3).softmax(-1),
        "after": after.softmax(-1),
    }


class Samples(Dataset):
    def __init__(self) -> None:
        self.out = outputs()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {k: v[i] for k, v in self.out.items() if k != "shadow"}
        return {**item, "shadow": self.out["shadow"][:, i]}


class Audit(L.LightningModule):
    """A user's module that audits an unlearned model in its validation loop, logging the attacks."""

    def __init__(self) -> None:
        super().__init__()
        self.mia, self.lira, self.mia_u = LossThresholdMIA(), OfflineLiRA(), MIAUnlearning(num_classes=C)
        self.values: dict[str, float] = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        role = batch["role"]
        for k, name in enumerate(("target", "member", "nonmember")):
            self.mia.update(batch["loss"][role == k], name)
        self.log("mia", self.mia)  # Lightning computes (and syncs) it at the epoch's end
        audit = role != 1  # forgotten vs test samples
        forgotten = role[audit] == 0
        shadow = batch["shadow"].transpose(0, 1)[:, audit]  # (S, n, C)
        self.lira.update(batch["probs"][audit], shadow, batch["labels"][audit], forgotten)
        self.mia_u.update(batch["before"][audit], batch["after"][audit], forgotten)

    def on_validation_epoch_end(self) -> None:
        lira = {f"lira_{k}": v for k, v in self.lira.compute().items()}
        self.log_dict({**lira, "mia_u": self.mia_u.compute()})
        self.values = {**{k: float(v) for k, v in lira.items()}, "mia_u": float(self.mia_u.compute())}


def main(out: str, devices: int) -> None:
    module = Audit()
    trainer = L.Trainer(strategy="ddp" if devices > 1 else "auto", accelerator="cpu", devices=devices, **QUIET_TRAINER)
    logged = trainer.validate(module, DataLoader(Samples(), batch_size=16, shuffle=False), verbose=False)[0]
    state = {**module.values, **{f"logged/{k}": float(v) for k, v in logged.items()}, "rank": trainer.global_rank}
    torch.save(state, out.replace(".pt", f".rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
