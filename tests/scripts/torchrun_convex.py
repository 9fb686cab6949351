"""A ``torchrun`` script: load a SoftmaxHeadRecorder checkpoint on every rank, forget, save what each rank holds.

Usage: ``torchrun --nproc_per_node R torchrun_convex.py STATE.pt OUT.pt`` (gloo, CPU). Run by tests/test_convex.py:
the recorder's collectives outside a Trainer, over torch.distributed's default group (``join_process_group`` on load).
"""

import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ddp_convex import Linear, rows

from lightning_unlearn import ForgetRequest, ReleaseConfig, ResolveUnlearner, SoftmaxHeadRecorder


def main(state_path: str, out: str) -> None:
    dist.init_process_group("gloo")
    state = torch.load(state_path, weights_only=True)
    model, recorder = Linear(), SoftmaxHeadRecorder(0.05, radius=1e-5)
    model.load_state_dict(state["module"])
    recorder.load_state_dict(state["recorder"])  # keeps this rank's share of the rows and joins the group
    loaded = rows(recorder)
    result = ResolveUnlearner(model, recorder, release=ReleaseConfig(noise=False)).forget(
        ForgetRequest.samples([0, 5, 202])
    )
    torch.save(
        {
            "loaded": loaded,
            "after": rows(recorder),
            "published": {k: v.clone() for k, v in model.state_dict().items()},
            "passes": result.extra["passes"],
            "world": recorder.world_size,
        },
        out.replace(".pt", f".rank{dist.get_rank()}.pt"),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
