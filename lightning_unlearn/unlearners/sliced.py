"""The certified softmax head on a backbone trained by slices: exact backbone retraining ([SISA]) under a re-solved,
(epsilon, delta)-released head ([derived], ``docs/certified_head.md``)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import cast

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from lightning_unlearn.callbacks.convex import SoftmaxHeadRecorder
from lightning_unlearn.callbacks.slices import SlicedBackbone, SliceRetrain, SliceStates
from lightning_unlearn.core.ledger import Ledger
from lightning_unlearn.core.result import UnlearningResult
from lightning_unlearn.functional import convex
from lightning_unlearn.privacy import ReleaseConfig
from lightning_unlearn.unlearners.base import ForgetData, MethodInfo, UnlearningUpdate
from lightning_unlearn.unlearners.convex import ResolveUnlearner, feature_assumption


class SlicedResolveUnlearner(ResolveUnlearner):
    """:class:`~lightning_unlearn.unlearners.convex.ResolveUnlearner` on the features of a backbone trained by a
    :class:`~lightning_unlearn.callbacks.slices.SlicedBackbone`: the backbone may have seen the samples to forget.

    A request whose ids the backbone never trained on (none in its slices) is a plain ``resolve`` request. A request
    naming samples it trained on first retrains the backbone from the first stage that saw them
    (:meth:`SlicedBackbone.retrain`: equal to training it from scratch on the retained samples, [SISA]), then
    recomputes the float64 features of every retained sample with the new trunk (read from ``data``: the training
    set, checked against the learned labels and input fingerprints), re-solves the head on them (warm started from the
    current head, the preconditioner's curvature rebuilt on the new features) to the recorder's certified tolerance,
    and releases it with the usual Gaussian noise calibrated on ``radius``. The module's trunk, the head, the recorder's
    rows, the backbone's slices and states, the catalog and the ledger change together at the commit, or not at all;
    after it, the backbone states that saw the forgotten samples and the replaced feature matrix are overwritten.

    Guarantee: the backbone part is **exact** (by construction, given deterministic training: see
    :class:`SlicedBackbone`), the head part is the (epsilon, delta) release of ``resolve`` on features that no longer
    depend on the forgotten samples, so the release is (epsilon, delta)-indistinguishable from retraining the backbone
    by slices on the retained data and solving the head on its features, published with the same noise.

    Requests name samples of the recorder's catalog (the head's): a sample the backbone trained on but the head
    never learned cannot be named here (train the backbone on the head's samples, or on data never forgotten).

    Cost: the retrained stages (``extra["backbone_stages_retrained"]``, the samples they passed
    ``extra["backbone_samples"]`` and ``extra["backbone_seconds"]``), one float64
    forward pass of the trunk over the retained samples and the head's Newton solve.

    Args:
        module, recorder, ledger: see :class:`~lightning_unlearn.unlearners.convex.ResolveUnlearner`; the recorder
            names the module's backbone (``SoftmaxHeadRecorder(backbone="trunk")``).
        backbone: the trained :class:`SlicedBackbone` whose ``trunk`` is the module's backbone (equal weights, checked
            here and before every request).
        feature_batch_size: rows per float64 forward pass when the features are recomputed.
        release: the noise, its calibration and accounting (:class:`~lightning_unlearn.privacy.ReleaseConfig`).

    Raises:
        ValueError: the recorder names no backbone, the backbone is not trained, or its trunk differs from the module's.
    """

    method = "sliced_resolve"
    method_info = MethodInfo(
        guarantee="backbone exact (the stages that saw the samples retrained), head (epsilon, delta) as resolve",
        assumptions="a backbone trained by [SISA] slices with deterministic kernels (stated); the head as resolve",
        cost="the retrained stages, one float64 forward pass over the retained samples and the head's Newton solve",
        paper="SISA, CR",
    )
    reads_data = True

    def __init__(
        self,
        module: nn.Module,
        recorder: SoftmaxHeadRecorder,
        backbone: SlicedBackbone,
        ledger: Ledger | None = None,
        *,
        feature_batch_size: int = 512,
        release: ReleaseConfig | None = None,
    ) -> None:
        super().__init__(module, recorder, ledger, release=release)
        if recorder.backbone is None:
            raise ValueError(
                "sliced_resolve recomputes the features of a named backbone: SoftmaxHeadRecorder(backbone='...')"
            )
        self.sliced = backbone
        self.feature_batch_size = int(feature_batch_size)
        self.check_trunk()

    @property
    def backbone_stages(self) -> SliceStates:
        """The backbone's slices and states (set at a request's commit, with the rest of its update)."""
        return self.sliced.stages

    @backbone_stages.setter
    def backbone_stages(self, stages: SliceStates) -> None:
        self.sliced.restore(stages)

    def check_trunk(self) -> None:
        """``ValueError`` unless the module's backbone holds exactly the sliced backbone's trunk weights."""
        name = self.recorder.backbone
        ours = self.recorder.backbone_of(self.module).state_dict()
        theirs = self.sliced.trunk_state()
        if set(ours) != set(theirs) or not all(torch.equal(ours[k], theirs[k].to(ours[k])) for k in ours):
            raise ValueError(
                f"sliced_resolve: the module's backbone {name!r} is not the SlicedBackbone's trunk "
                f"{self.sliced.trunk!r} after its last stage (other tensors or values): the head's features must come "
                "from the backbone that forgetting retrains (copy its trunk into the module before fitting the head)"
            )

    def _compute(self, ids: Tensor, data: ForgetData) -> UnlearningUpdate:
        self.check_trunk()
        seen = self.sliced.saw(ids)
        if not bool(seen.any()):
            return self._certified(super()._compute(ids, data), None)
        rec = self.recorder
        if data is None:
            raise ValueError(
                f"sliced_resolve: the backbone {rec.backbone!r} was trained on sample ids {ids[seen][:10].tolist()} of "
                "this request: retraining it and recomputing every retained sample's features needs the training set: "
                "pass data=<the training dataset, yielding (x, y, sample_id)>"
            )
        keep = ~rec.rows_of(ids)
        labels, kept_ids = cast(Tensor, rec.labels)[keep], cast(Tensor, rec.row_ids)[keep]  # rows_of: the rows exist
        try:
            x, _ = self.forget_samples(kept_ids, data)  # labels and input fingerprints checked against the learned
        except ValueError as err:
            raise ValueError(
                f"sliced_resolve reads every retained sample from data= (the training set) to recompute its features: "
                f"{err}"
            ) from err
        retrain = self.sliced.retrain(ids[seen], data.dataset if isinstance(data, DataLoader) else data)
        features = self._features(self.sliced.trunk_state(retrain.stages.states[-1]), x)
        problem = rec.problem_of(features.to(rec.row_dtype), labels)
        curvature = convex.FeatureCurvature.at(rec.solved_head, problem)
        solution = rec.solve(problem, rec.solved_head, curvature)
        statistics = {"feature_rows": problem.features, "labels": labels, "row_ids": kept_ids, "W": solution.W}
        update = self.release_head(ids, solution, {**statistics, "curvature": curvature, "sums": solution.sums})
        update.weights = {**update.weights, **self._trunk_weights(retrain)}
        update.state = {**update.state, "backbone_stages": retrain.stages}
        update.extra.update(
            backbone_retrained=True,
            backbone_forgotten=int(seen.sum()),
            backbone_first_stage=retrain.first_stage,
            backbone_stages_retrained=retrain.retrained,
            backbone_samples=retrain.samples,
            backbone_seconds=retrain.seconds,
        )
        return self._certified(update, retrain)

    def _features(self, trunk: dict[str, Tensor], x: Tensor) -> Tensor:
        """The recorder's float64 features of ``x`` under a module whose backbone holds ``trunk`` (a copy: the module
        is not touched)."""
        work = copy.deepcopy(self.module)
        self.recorder.backbone_of(work).load_state_dict(trunk)
        return torch.cat([self.recorder.features(work, part) for part in x.split(self.feature_batch_size)])

    def _trunk_weights(self, retrain: SliceRetrain) -> dict[str, Tensor]:
        prefix = f"{self.recorder.backbone}."
        return {prefix + k: v.clone() for k, v in self.sliced.trunk_state(retrain.stages.states[-1]).items()}

    def _certified(self, update: UnlearningUpdate, retrain: SliceRetrain | None) -> UnlearningUpdate:
        """The certificate of ``resolve`` with the backbone's part: exact retraining, or untouched."""
        rec, cert = self.recorder, update.certificate
        slices = self.sliced.count
        stated = (
            f"features: backbone {rec.backbone!r} is the trunk of a SlicedBackbone ({slices} slices; weights checked "
            "equal before the request) and every sample it was trained on is in its slices, so a request naming one "
            "retrains it from the first stage that saw it, which equals training it from scratch on the retained "
            "slices [SISA] if its training is deterministic (stated, not checked: CPU kernels, the same threads and "
            "library versions)"
        )
        assumptions = [stated if a == feature_assumption(rec) else a for a in cert.assumptions]
        if retrain is None:
            part = "backbone: never trained on these samples (none in its slices), unchanged"
        else:
            part = (
                f"backbone: exact, stages {retrain.first_stage}..{slices} retrained on the retained samples "
                "(equal to training from scratch with the same slices and seeds [SISA])"
            )
        update.certificate = replace(cert, statement=f"{part}; head: {cert.statement}", assumptions=assumptions)
        if retrain is None:
            update.extra.update(
                backbone_retrained=False, backbone_stages_retrained=0, backbone_samples=0, backbone_seconds=0.0
            )
        return update

    def _commit(self, result: UnlearningResult, update: UnlearningUpdate) -> Exception | None:
        """The commit of :class:`Unlearner`; once it is done, the backbone states that saw the forgotten
        samples are overwritten."""
        before = self.sliced.stages
        unerased = super()._commit(result, update)
        if self.sliced.stages is not before:
            self.sliced.erase(before)
        return unerased
