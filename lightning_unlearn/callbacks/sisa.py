"""`SISABackbone`: your network trained as [SISA]'s shards x slices along a continual stream, published as the
ensemble of its shards (their logits averaged, or a closed-form ridge head over their trunks' features), so that
forgetting retrains only the shards that saw the forgotten samples, from their first slice that did; temporary
experiences ([CLPU]) sit on top of the permanent ones and are dropped at no cost."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from time import process_time
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from lightning_unlearn.callbacks.base import RecorderCallback
from lightning_unlearn.callbacks.slices import (
    _REFUSED_TRAINER_OPTIONS,
    _cloned,
    _ids_of,
    _learned_ids,
    _rows,
    train_stage,
)
from lightning_unlearn.contract import BatchKeys, trains_itself, unpack_batch
from lightning_unlearn.functional.acu import one_hot
from lightning_unlearn.functional.sisa import PARTITIONS, Partition, assign, first_changed, stage_rows, stage_seed
from lightning_unlearn.models import float64_forward
from lightning_unlearn.modes import eval_mode
from lightning_unlearn.progress import status

State = dict[str, Tensor]
Aggregate = Literal["logits", "head"]
AGGREGATES: tuple[Aggregate, ...] = ("logits", "head")


@dataclass(frozen=True)
class Stage:
    """One slice position of the stream: the experience it belongs to and, per shard, the ids of its slice (in
    training order) and their labels."""

    experience: int
    ids: tuple[Tensor, ...]
    labels: tuple[Tensor, ...]


@dataclass(frozen=True)
class SISAState:
    """The stages in training order (the permanent experiences' slices, then the temporary ones') and, per shard,
    its ``state_dict`` before stage 1 (``states[s][0]``, the initial weights) and after each stage ``t``.

    With ``aggregate="head"`` also the ridge head ``head`` (``(S d_F, num_classes)``, float64) and its cache: the
    retained ids ``feature_ids`` (sorted), per shard their trunk features ``features[s]`` (float64 storage; row ``i``
    is ``feature_ids[i]``'s) and their Gram matrix ``gram`` (``F^T F``); empty after a restore (recomputed at the next
    change).
    """

    stages: tuple[Stage, ...]
    states: tuple[tuple[State, ...], ...]
    temporary: tuple[int, ...] = ()
    head: Tensor | None = None
    feature_ids: Tensor | None = None
    features: tuple[Tensor, ...] = ()
    gram: Tensor | None = None

    def slices(self, shard: int) -> list[Tensor]:
        """Shard ``shard``'s slices, by stage."""
        return [st.ids[shard] for st in self.stages]

    def ids(self) -> Tensor:
        """Every sample id in a slice."""
        parts = [i for st in self.stages for i in st.ids]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)

    def seen(self, num_classes: int) -> Tensor:
        """``[shards, num_classes]``: whether a shard's slices hold a sample of the class."""
        mask = torch.zeros(len(self.states), num_classes, dtype=torch.bool)
        for st in self.stages:
            for s, labels in enumerate(st.labels):
                mask[s, labels] = True
        return mask

    def tensors(self) -> list[Tensor]:
        """The distinct tensors held: the stored states' (a skipped stage shares its predecessor's), the head and its
        feature cache."""
        held = [t for states in self.states for state in states for t in state.values()] + list(self.features)
        extra = [t for t in (self.head, self.gram) if t is not None]
        unique = {id(t): t for t in (*held, *extra)}
        return list(unique.values())

    def storage_bytes(self) -> int:
        """Bytes of :meth:`tensors`."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass(frozen=True)
class SISAChange:
    """What a change of the slices (learning, forgetting, making permanent) computes before anything changes.

    Args:
        state: the new stages and states.
        first: per shard, the stages kept (0-based index of the first stage trained again; ``len(stages)`` when none).
        trained: per shard, the stages that trained (a stage whose own slice is empty, or has no epochs, is skipped).
        samples: the samples the trained stages passed forward and backward (epochs times rows, summed).
        seconds: this process's CPU seconds (``time.process_time``) of the training and, with the head, of its
            features and solve.
        computed: the feature rows the head computed (retained samples times trunks run; 0 with ``"logits"``).
    """

    state: SISAState
    first: tuple[int, ...]
    trained: tuple[int, ...]
    samples: int
    seconds: float
    computed: int = 0


class SISAEnsemble(L.LightningModule):
    """The published model: ``S`` constituent copies of your module, aggregated.

    ``aggregate="logits"``: their logits averaged, for each class over the shards whose retained samples hold that
    class (``seen``). Averaging over the shards that saw a class (not over all) keeps the aggregate meaningful under
    ``partition="class"`` as far as it goes: a shard trained without class ``c`` pushes ``c``'s logit down for every
    input. Under a random partition every shard holds every class and it is [SISA]'s aggregation by averaging.

    ``aggregate="head"``: ``[f_1(x), ..., f_S(x)] W``, the shards' trunks' features (float64, eval mode,
    :func:`~lightning_unlearn.models.float64_forward`) concatenated and read by the ridge head ``head`` (``W``, solved
    by the backbone in closed form on every retained sample: one calibrated scale for all shards, whatever classes
    each saw).

    Either way a class no shard holds gets ``-inf``. It trains nothing itself (its :class:`SISABackbone` trains the
    constituents): fitted by ``fit_stream``, its ``training_step`` steps an optimizer that changes nothing, so that
    the backbone (a callback) sees the experience's batches.
    """

    def __init__(
        self,
        module: nn.Module,
        shards: int,
        num_classes: int,
        aggregate: Aggregate = "logits",
        trunk: str | None = None,
        feature_dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.aggregate, self.trunk, self.feature_dtype = aggregate, trunk, feature_dtype
        self.members = nn.ModuleList(copy.deepcopy(module) for _ in range(shards))
        self.seen: Tensor
        self.register_buffer("seen", torch.zeros(shards, num_classes, dtype=torch.bool))
        self.head: Tensor
        self.register_buffer("head", torch.zeros(0, num_classes, dtype=torch.float64))

    def features(self, x: Any) -> Tensor:
        """``[f_1(x), ..., f_S(x)]``: every shard's trunk output (flattened, computed in ``feature_dtype``), float64,
        eval mode."""
        return torch.cat([trunk_features(m, self.trunk, x, self.feature_dtype) for m in self.members], dim=1)

    def forward(self, x: Any) -> Tensor:
        used = [s for s in range(len(self.members)) if bool(self.seen[s].any())]
        if not used:
            raise ValueError("SISAEnsemble has learned nothing yet (no shard holds a sample)")
        if self.aggregate == "head":
            out = self.features(x) @ self.head
            return out.masked_fill(~self.seen.any(0), float("-inf"))
        logits = torch.stack([self.members[s](x) for s in used])
        mask = self.seen[used].unsqueeze(1).to(logits.dtype)
        count = mask.sum(0)
        total = (logits * mask).sum(0)
        return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("-inf")))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.optimizers().step()  # type: ignore[union-attr]  # no gradient, no change: counts the step

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def trunk_features(module: nn.Module, trunk: str | None, x: Any, dtype: torch.dtype = torch.float64) -> Tensor:
    """``module``'s submodule ``trunk`` (``None``: the whole module) applied to ``x`` in eval mode, one flattened
    float64 row per sample: computed in float64 (:func:`~lightning_unlearn.models.float64_forward`) or, with
    ``dtype=torch.float32``, in the module's own float32 and then cast."""
    part = module if trunk is None else module.get_submodule(trunk)
    if dtype == torch.float64:
        return float64_forward(part, x).flatten(1)
    with torch.no_grad(), eval_mode(part):
        return part(x).flatten(1).to(torch.float64)


_FEATURE_CHUNK = 512  # the head's feature rows are computed in chunks of this many, in id order


@dataclass
class _Incoming:
    data: Dataset | None = None
    temporary: bool = False
    slices: Sequence[Sequence[Sequence[int] | Tensor]] | None = None
    hooks: list[Callable[[], Any]] = field(default_factory=list)


class SISABackbone(RecorderCallback):
    """Trains your ``LightningModule`` as ``shards`` isolated copies, each on its own shard of every experience, by
    slices aligned with the stream ([SISA] Sec. IV-B, cumulative slices), and publishes their ensemble
    (:attr:`ensemble`, a :class:`SISAEnsemble`).

    Experience ``k`` (:meth:`learn`, or a ``fit_stream`` fit of :attr:`ensemble` with this callback) is split into
    ``shards`` x ``slices_per_experience`` slices (:func:`~lightning_unlearn.functional.sisa.assign`: at random, or by
    class); each becomes a new *stage* of every shard. Stage ``t`` of shard ``s`` trains a copy of the module, from the
    shard's state after stage ``t - 1``, on the shard's slices ``1..t`` for ``epochs[t - 1]`` epochs with your own
    ``training_step`` and ``configure_optimizers`` (a fresh optimizer per stage), in one Lightning fit seeded
    ``stage_seed(seed, s, t)``; a stage whose own slice is empty is skipped (its state is the one before it). The state
    after every stage is kept (:meth:`storage_bytes`).

    **Invariant** (what makes forgetting exact): the stored states are always those of training from scratch, with
    these seeds and initial weights, on the current slices in the current stage order. Every change recomputes, per
    shard, only the stages from the first whose slice changed
    (:func:`~lightning_unlearn.functional.sisa.first_changed`):
    a stage is a deterministic function of its start state, its rows (in order), its epochs and its seed, so the
    earlier states are the ones a from-scratch run computes. Forgetting ids removes them from their slices (an
    experience left without samples leaves the stage order): only the shards that held them retrain, from their first
    slice that did (:class:`~lightning_unlearn.unlearners.sisa.SISAUnlearner`).

    **Temporary experiences** ([CLPU]): an experience learned with ``temporary=True`` (or listed in ``temporary=``)
    is placed after every permanent one, so it sits on top of the permanent stages: forgetting it drops its stages
    (no training; the states below never saw it, bitwise those of a run that never learned it). A permanent experience
    learned while temporary ones are held goes below them, so their stages train again on top of it (the learning
    costs more; the forgetting stays free). :meth:`keep` makes a temporary experience permanent (moved below the other
    temporary ones: free if it is the lowest).

    **The ridge head** (``aggregate="head"``): the published model reads the concatenated features of the shards'
    ``trunk`` submodules through ``W = (F^T F + ridge I)^{-1} F^T Y`` ([ACU] eq. 3-4, float64), ``F`` the features of
    every retained sample (rows by id), ``Y`` their one-hot labels. Every change re-solves it: the features of a shard
    whose last state is unchanged are kept (its cached rows of the retained ids), those of a retrained shard are
    computed again (one forward pass over the retained samples, in chunks of 512 rows in id order); ``F^T F`` is
    updated by blocks (the blocks of a recomputed shard computed again, the others less the removed rows' products
    plus the added rows'); the cache replaced is overwritten with zeros, so no feature row of a forgotten sample is
    kept. ``W`` is a function of the shards and the retained samples, so it equals the head of a from-scratch run up
    to the rounding of the features and of the block updates. With ``feature_dtype=torch.float64`` (the default)
    that rounding is float64's. With ``feature_dtype=torch.float32`` the trunk runs in the module's float32 (several
    times faster on CPU) and only ``F^T F`` and the solve are float64: a kept row was computed in another chunk than
    a from-scratch run computes it in (the chunks shift when a row leaves), and a float32 kernel's last bits depend
    on the batch, so the features agree to float32 rounding (relative ``~eps_32`` times the trunk's accumulation
    length) and the heads to that times the condition number of ``F^T F + ridge I``: exact to float32 rounding, not
    bitwise.

    **What breaks exactness**: as for :class:`~lightning_unlearn.callbacks.slices.SlicedBackbone`, a stage that is not
    a deterministic function of those inputs (GPU kernels without ``deterministic=True``, another thread count,
    library version or machine between training and retraining, loader workers, state outside ``state_dict``).

    Args:
        module: your ``LightningModule`` with its own ``training_step`` and ``configure_optimizers``, returning logits
            over ``num_classes`` classes; its weights now are every shard's initial weights.
        num_classes: the classes of the logits.
        shards: the number ``S`` of isolated constituent models.
        slices_per_experience: the slices (stages) each experience adds to every shard.
        epochs: the epochs of every stage, or per stage position (as many as the stream will have stages:
            :func:`~lightning_unlearn.functional.sisa.sisa_epochs` gives [SISA]'s schedule for a known length).
        partition: ``"random"`` or ``"class"`` (each class in shard ``class mod S``, [ARCANE]).
        aggregate: ``"logits"`` (the shards' logits averaged) or ``"head"`` (the ridge head over their features).
        trunk: with ``"head"``, the submodule whose output is a shard's features (``None``: the whole module).
        ridge: with ``"head"``, the ridge regulariser ``gamma > 0``.
        feature_dtype: with ``"head"``, the precision the trunk features are computed in: ``torch.float64`` (exact
            to float64 rounding) or ``torch.float32`` (faster; exact to float32 rounding, see above).
        temporary: experience numbers declared temporary when they are learned.
        batch_size, seed, batch_keys, trainer_kwargs: the stages' batch size, base seed, dict-batch keys and further
            ``L.Trainer`` options (epochs and multi-process options refused).
        fingerprint: keep a digest of each learned input (see :class:`RecorderCallback`).

    Raises:
        TypeError: ``module`` has no training recipe of its own.
        ValueError: fewer than one shard or slice, bad epochs, partition, batch size or Trainer options; an unknown
            aggregate, a ``trunk`` the module lacks (or given with ``"logits"``), a ridge not above 0, a
            ``feature_dtype`` other than float32 or float64.
    """

    gathers_inputs = True

    def __init__(
        self,
        module: L.LightningModule,
        *,
        num_classes: int,
        shards: int = 1,
        slices_per_experience: int = 1,
        epochs: int | Sequence[int] = 1,
        partition: Partition = "random",
        aggregate: Aggregate = "logits",
        trunk: str | None = None,
        ridge: float = 1.0,
        feature_dtype: torch.dtype = torch.float64,
        temporary: Sequence[int] = (),
        batch_size: int = 64,
        seed: int = 0,
        batch_keys: BatchKeys | None = None,
        trainer_kwargs: Mapping[str, Any] | None = None,
        fingerprint: bool = True,
    ) -> None:
        if not trains_itself(module):
            raise TypeError(
                "SISABackbone trains copies of the module with its own training_step and configure_optimizers: give a "
                f"LightningModule with both (automatic optimization), got {type(module).__name__}"
            )
        if shards < 1 or slices_per_experience < 1 or num_classes < 1 or batch_size < 1:
            raise ValueError(
                "SISABackbone needs shards, slices_per_experience, num_classes and batch_size >= 1, got "
                f"{shards}, {slices_per_experience}, {num_classes} and {batch_size}"
            )
        per_stage = [int(epochs)] if isinstance(epochs, int) else [int(e) for e in epochs]
        if not per_stage or min(per_stage) < 0:
            raise ValueError(f"SISABackbone epochs must be a non-negative number or one per stage, got {epochs}")
        if partition not in PARTITIONS:
            raise ValueError(f"SISABackbone partition must be one of {PARTITIONS}, got {partition!r}")
        if aggregate not in AGGREGATES or (aggregate == "logits" and trunk is not None) or not ridge > 0:
            raise ValueError(
                f"SISABackbone aggregate must be one of {AGGREGATES} (trunk= only with 'head') and ridge > 0, got "
                f"{aggregate!r}, trunk={trunk!r}, ridge={ridge}"
            )
        if feature_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"SISABackbone feature_dtype must be torch.float32 or torch.float64, got {feature_dtype}")
        if trunk is not None:
            try:
                module.get_submodule(trunk)
            except AttributeError as err:
                raise ValueError(f"SISABackbone: the module has no submodule {trunk!r} (trunk=)") from err
        options = dict(trainer_kwargs or {})
        refused = [k for k in _REFUSED_TRAINER_OPTIONS if k in options]
        if refused:
            raise ValueError(f"SISABackbone trainer_kwargs cannot set {refused}: each stage's epochs are epochs=")
        super().__init__(fingerprint=fingerprint, batch_keys=batch_keys)
        self.template = module
        self.num_classes, self.shards, self.slices_per_experience = int(num_classes), int(shards), slices_per_experience
        self.epochs, self._epochs_each = per_stage, isinstance(epochs, int)
        self.partition: Partition = partition
        self.aggregate: Aggregate = aggregate
        self.trunk, self.ridge, self.feature_dtype = trunk, float(ridge), feature_dtype
        self.temporary_experiences = {int(k) for k in temporary}
        self.batch_size, self.seed, self.trainer_kwargs = int(batch_size), int(seed), options
        self.ensemble = SISAEnsemble(module, self.shards, self.num_classes, aggregate, trunk, feature_dtype)
        initial = _cloned(module.state_dict())
        self._sisa = SISAState((), tuple((initial,) for _ in range(self.shards)))
        self._data: list[Dataset] = []  # the experiences' datasets (read again by retraining), in learning order
        self._where: dict[int, int] = {}  # sample id -> row of ConcatDataset(self._data)
        self._incoming = _Incoming()
        self._retired: list[SISAState] = []  # replaced by committed requests, erased after the commit
        #: the last learning's :class:`SISAChange` (its cost)
        self.last_change: SISAChange | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(shards=self.shards, slices=self.slices_per_experience, seed=self.seed)

    @property
    def sisa(self) -> SISAState:
        """The stages and stored states (replaced as a whole by learning, a request's commit, or :meth:`keep`)."""
        return self._sisa

    @sisa.setter
    def sisa(self, state: SISAState) -> None:
        self._sisa = state

    def storage_bytes(self) -> int:
        """Bytes of the stored states (:meth:`SISAState.storage_bytes`)."""
        return self._sisa.storage_bytes()

    def add_boundary_hook(self, hook: Callable[[], Any]) -> None:
        """Call ``hook()`` at each experience boundary, before the next experience is learned (an unlearner's
        queue of requests is flushed there)."""
        self._incoming.hooks.append(hook)

    # -- learning ------------------------------------------------------------------------------------------------
    def learn(
        self,
        data: Dataset,
        *,
        experience: int | None = None,
        temporary: bool = False,
        slices: Sequence[Sequence[Sequence[int] | Tensor]] | None = None,
    ) -> SISAChange:
        """Learn one experience: its samples become ``slices_per_experience`` new stages of every shard.

        Args:
            data: the experience's training set, yielding ``(x, y, sample_id)`` (or dicts); kept (by reference) for
                retraining.
            experience: its number (default: the next one).
            temporary: learn it as a temporary experience (see the class docstring).
            slices: the assignment itself instead of :func:`~lightning_unlearn.functional.sisa.assign`: per shard, the
                same number of id lists, together exactly the experience's ids.

        Returns:
            the change, with its cost (also :attr:`last_change`).

        Raises:
            ValueError: ids learned before or repeated, an experience number learned before, labels outside
                ``num_classes``, a bad ``slices``, too few ``epochs`` for the stages; nothing is changed.
        """
        for hook in self._incoming.hooks:
            hook()
        self.last_change = None
        self._incoming.data, self._incoming.temporary, self._incoming.slices = data, temporary, slices
        if experience is not None:
            self.experience = experience
        try:
            self.begin_experience(self.ensemble)
            for batch in DataLoader(data, batch_size=512):
                x, y, ids = unpack_batch(batch, self.batch_keys)
                self.record(self.ensemble, x, y, ids)
            self.end_experience(self.ensemble)
        finally:
            self._drop_staged()
            self._incoming.data, self._incoming.slices = None, None
        if self.last_change is None:
            raise ValueError("SISABackbone.learn: the experience holds no sample")
        return self.last_change

    def keep(self, experience: int) -> SISAChange:
        """Make temporary experience ``experience`` permanent: its stages move below the other temporary ones
        (retraining from there; nothing trains if it is the lowest).

        Raises:
            ValueError: ``experience`` is not a temporary experience held here; nothing is changed.
        """
        old = self._sisa
        if experience not in old.temporary:
            raise ValueError(
                f"SISABackbone.keep: experience {experience} is not temporary here (temporary: {list(old.temporary)})"
            )
        temporary = tuple(k for k in old.temporary if k != experience)
        order = self._ordered(old.stages, temporary)
        change = self.rebuild(order, temporary, self._held_data())
        self.install(change)
        return change

    def _record(self, module: nn.Module, x: Tensor, y: Tensor, ids: Tensor, outputs: Any) -> None:
        return None  # the base class stages ids, labels and fingerprints; the stages train at the commit

    def _commit(self, module: nn.Module) -> None:
        """Train the staged experience's stages (and those above it), then keep its data."""
        ids, labels = torch.cat(self._staged_ids), torch.cat(self._staged_labels)
        ids, order = ids.sort()  # the assignment depends on the set of ids, not on the order a loader gave them
        labels = labels[order]
        experience, incoming = self._fit_experience, self._incoming
        if incoming.data is None:
            raise ValueError("SISABackbone: no training data to learn from (use learn(data) or fit its ensemble)")
        if experience in {st.experience for st in self._sisa.stages}:
            raise ValueError(f"SISABackbone: experience {experience} is learned already: number the next one anew")
        if int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
            raise ValueError(f"SISABackbone: labels outside 0..{self.num_classes - 1} (num_classes)")
        parts = (
            self._given(ids, incoming.slices)
            if incoming.slices is not None
            else assign(ids, labels, self.shards, self.slices_per_experience, self.seed, experience, self.partition)
        )
        label_of = dict(zip(ids.tolist(), labels.tolist()))
        new = [
            Stage(
                experience,
                tuple(parts[s][j] for s in range(self.shards)),
                tuple(torch.tensor([label_of[i] for i in parts[s][j].tolist()], dtype=torch.long) for s in
                      range(self.shards)),
            )
            for j in range(len(parts[0]))
        ]  # fmt: skip
        old = self._sisa
        temporary = old.temporary
        if incoming.temporary or experience in self.temporary_experiences:
            temporary = (*temporary, experience)
        offset = len(ConcatDataset(self._data)) if self._data else 0
        rows = _rows(_ids_of(incoming.data, self.batch_keys), ids)
        where = {**self._where, **{i: offset + r for i, r in rows.items()}}
        datasets = [*self._data, incoming.data]
        change = self.rebuild(
            self._ordered((*old.stages, *new), temporary), temporary, (ConcatDataset(datasets), where)
        )
        self._data, self._where = datasets, where
        self.install(change)
        self.last_change = change

    def _given(self, ids: Tensor, slices: Sequence[Sequence[Sequence[int] | Tensor]]) -> list[list[Tensor]]:
        """The ``slices=`` of :meth:`learn`, checked: one list per shard, as many slices in each, exactly ``ids``."""
        parts = [[torch.as_tensor(sl, dtype=torch.long).flatten() for sl in shard] for shard in slices]
        if len(parts) != self.shards or len({len(p) for p in parts}) != 1 or not parts[0]:
            raise ValueError(
                f"SISABackbone.learn slices= must give {self.shards} shards, each the same number (>= 1) of slices"
            )
        given = torch.cat([sl for p in parts for sl in p])
        if len(given) != len(ids) or not torch.equal(given.sort().values, ids.sort().values):
            raise ValueError("SISABackbone.learn slices= must hold exactly the experience's sample ids, once each")
        return parts

    # -- the one routine every change goes through ---------------------------------------------------------------
    def rebuild(
        self, stages: Sequence[Stage], temporary: tuple[int, ...], data: tuple[Dataset, Mapping[int, int]]
    ) -> SISAChange:
        """The states of training from scratch on ``stages`` (in this order), reusing each shard's stored states up to
        its first changed slice and training the rest; changes nothing.

        Args:
            stages: the new stage order.
            temporary: the temporary experiences after the change.
            data: a dataset holding the samples of the stages to train and ``{sample id: row}`` into it.

        Raises:
            ValueError: the data lacks a sample to train on, or ``epochs`` names fewer stages than there are.
        """
        if not self._epochs_each and len(stages) > len(self.epochs):
            raise ValueError(
                f"SISABackbone epochs names {len(self.epochs)} stages; the stream now has {len(stages)}: give one "
                "number, or one per stage of the whole stream"
            )
        dataset, where = data
        old = self._sisa
        start = process_time()
        states, first, trained, samples = [], [], [], 0
        for s in range(self.shards):
            new_slices = [st.ids[s] for st in stages]
            f = first_changed(old.slices(s), new_slices)
            out = list(old.states[s][: f + 1])
            done = 0
            for t in range(f + 1, len(stages) + 1):
                rows, epochs = stage_rows(new_slices, t), self.epoch_of(t)
                state = out[-1]
                if len(rows) and epochs:
                    status(f"SISABackbone: shard {s + 1}/{self.shards}, stage {t}/{len(stages)} ({epochs} epoch(s))")
                    missing = [i for i in rows.tolist() if i not in where]
                    if missing:
                        raise ValueError(
                            f"SISABackbone: the data lacks {len(missing)} sample ids of shard {s}'s slices, e.g. "
                            f"{missing[:10]}"
                        )
                    state = train_stage(
                        self.template,
                        state,
                        [where[i] for i in rows.tolist()],
                        dataset,
                        epochs,
                        self.batch_size,
                        stage_seed(self.seed, s, t),
                        self.trainer_kwargs,
                    )
                    samples, done = samples + epochs * len(rows), done + 1
                out.append(state)
            states.append(tuple(out))
            first.append(f)
            trained.append(done)
        new = SISAState(tuple(stages), tuple(states), temporary)
        computed = 0
        if self.aggregate == "head":
            new, computed = self._solve_head(new, data)
        return SISAChange(new, tuple(first), tuple(trained), samples, process_time() - start, computed)

    def _solve_head(self, state: SISAState, data: tuple[Dataset, Mapping[int, int]]) -> tuple[SISAState, int]:
        """``state`` with its ridge head and feature cache: the rows of shards whose last state is unchanged taken
        from the current cache, the others computed; and the number of rows computed.

        Raises:
            ValueError: the data lacks a retained sample whose features must be computed.
        """
        old = self._sisa
        parts = [(i, y) for st in state.stages for i, y in zip(st.ids, st.labels)]
        ids = torch.cat([i for i, _ in parts]) if parts else torch.zeros(0, dtype=torch.long)
        labels = torch.cat([y for _, y in parts]) if parts else torch.zeros(0, dtype=torch.long)
        ids, order = ids.sort()
        if not len(ids):
            return state, 0
        cached = old.feature_ids if old.feature_ids is not None else torch.zeros(0, dtype=torch.long)
        known = torch.isin(ids, cached)
        features, kept, computed = [], [], 0
        for s, states in enumerate(state.states):
            keep = bool(old.features) and states[-1] is old.states[s][-1]
            todo = ids[~known] if keep else ids
            computed += len(todo)
            kept.append(keep)
            if not keep:
                features.append(self._features(states[-1], todo, data))
                continue
            at = torch.searchsorted(cached, ids).clamp(max=len(cached) - 1)
            block = old.features[s][at]  # the rows of unknown ids are overwritten below
            if len(todo):
                block[~known] = self._features(states[-1], todo, data)
            features.append(block)
        F = torch.cat(features, dim=1)
        gram = _gram(F, old, kept, ~torch.isin(cached, ids), ~known)
        A = gram + self.ridge * torch.eye(len(gram), dtype=gram.dtype)
        W = torch.cholesky_solve(F.T @ one_hot(labels[order], self.num_classes), torch.linalg.cholesky(A))
        return replace(state, head=W, feature_ids=ids, features=tuple(features), gram=gram), computed

    def _features(self, weights: State, ids: Tensor, data: tuple[Dataset, Mapping[int, int]]) -> Tensor:
        """The trunk features (float64, eval mode) of the samples ``ids`` under the shard state ``weights``.

        Raises:
            ValueError: the data lacks one of ``ids``.
        """
        dataset, where = data
        missing = [i for i in ids.tolist() if i not in where]
        if missing:
            raise ValueError(
                f"SISABackbone: the data lacks {len(missing)} retained sample ids the head reads, e.g. {missing[:10]}"
            )
        module = copy.deepcopy(self.template)
        module.load_state_dict(weights)
        rows = [where[i] for i in ids.tolist()]
        loader = DataLoader(Subset(dataset, rows), batch_size=_FEATURE_CHUNK)
        inputs = (unpack_batch(b, self.batch_keys)[0] for b in loader)
        return torch.cat([trunk_features(module, self.trunk, x, self.feature_dtype) for x in inputs])

    def epoch_of(self, stage: int) -> int:
        """The epochs of stage ``stage`` (1-based)."""
        return self.epochs[0] if self._epochs_each else self.epochs[stage - 1]

    def weights_of(self, change: SISAChange) -> dict[str, Tensor]:
        """The ensemble's new tensors after ``change`` (``state_dict`` names): the last state of every shard that
        changed, and ``seen``."""
        out: dict[str, Tensor] = {"seen": change.state.seen(self.num_classes)}
        if change.state.head is not None:
            out["head"] = change.state.head.clone()
        for s, states in enumerate(change.state.states):
            if states[-1] is not self._sisa.states[s][-1]:
                out.update({f"members.{s}.{k}": v.clone() for k, v in states[-1].items()})
        return out

    def install(self, change: SISAChange) -> None:
        """Make ``change`` current (the ensemble gets its weights) and erase the states it replaced."""
        weights = self.weights_of(change)
        replaced = self._sisa
        if "head" in weights:
            self.ensemble.head.data = weights["head"]  # its width is known once features were computed
        self.ensemble.load_state_dict({**self.ensemble.state_dict(), **weights})
        self._sisa = change.state
        self._erase(replaced)

    def _ordered(self, stages: Sequence[Stage], temporary: tuple[int, ...]) -> list[Stage]:
        """``stages`` with the permanent experiences' first (in their order), then the temporary ones' in the order
        of ``temporary``."""
        permanent = [st for st in stages if st.experience not in temporary]
        return permanent + [st for k in temporary for st in stages if st.experience == k]

    def _held_data(self) -> tuple[Dataset, Mapping[int, int]]:
        return ConcatDataset(self._data) if self._data else _Empty(), self._where

    # -- forgetting ----------------------------------------------------------------------------------------------
    def saw(self, ids: Tensor) -> Tensor:
        """A boolean mask of the ``ids`` in a slice (learned and not forgotten)."""
        return torch.isin(torch.as_tensor(ids, dtype=torch.long).cpu(), self._sisa.ids())

    def plan_forget(self, ids: Tensor, data: Dataset | None = None) -> SISAChange:
        """The states without ``ids``: removed from their slices (emptied stages stay in place, skipped, except at
        the top of the order, where they are trimmed: a temporary experience forgotten whole is dropped), each shard
        retrained from its first changed slice. Changes nothing.

        Args:
            ids: the sample ids to forget.
            data: a dataset holding the retained samples of the stages to retrain; default: the experiences learned
                in this process (after a restore from a state dict there are none: pass it).

        Raises:
            ValueError: ids in no slice (unknown or already forgotten), or no data holding what must be retrained;
                nothing is changed.
        """
        ids = _learned_ids(ids, self.saw, "SISABackbone")
        stages = []
        for st in self._sisa.stages:
            keep = [~torch.isin(i, ids) for i in st.ids]
            stages.append(Stage(st.experience, tuple(i[k] for i, k in zip(st.ids, keep)),
                                tuple(y[k] for y, k in zip(st.labels, keep))))  # fmt: skip
        while stages and not any(len(i) for i in stages[-1].ids):
            stages.pop()  # trailing empty stages are trimmed; others stay in place (skipped), keeping positions
        present = {st.experience for st in stages}
        temporary = tuple(k for k in self._sisa.temporary if k in present)
        if data is None:
            held = self._held_data()
        else:
            keys = _ids_of(data, self.batch_keys)
            held = (data, {int(i): r for r, i in enumerate(keys.tolist())})
        return self.rebuild(stages, temporary, held)

    def dropped(self, change: SISAChange) -> list[int]:
        """The experiences ``change`` leaves without a sample."""
        return sorted(_holding(self._sisa) - _holding(change.state))

    def apply_forget(self, ids: Tensor, change: Mapping[str, Any]) -> Callable[[], None]:
        """Install a request's new :attr:`sisa` (``change["sisa"]``); the states it replaces are erased once the
        request is committed (:meth:`erase_forgotten`)."""
        old = self._sisa
        undo = super().apply_forget(ids, change)
        self._retired.append(old)

        def undo_all() -> None:
            self._retired.remove(old)
            undo()

        return undo_all

    def erase_forgotten(self, ids: Tensor) -> None:
        """Overwrite with zeros every stored tensor of the replaced states that the current ones no longer hold."""
        while self._retired:
            self._erase(self._retired.pop())

    def _erase(self, replaced: SISAState) -> None:
        current = {id(t) for t in self._sisa.tensors()}
        with torch.no_grad():
            for t in replaced.tensors():
                if id(t) not in current:
                    t.zero_()

    # -- Lightning ------------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A fit of :attr:`ensemble` (``fit_stream``) learns its training set as the next experience."""
        if pl_module is not self.ensemble:
            raise ValueError("SISABackbone: fit its ensemble (backbone.ensemble) with it, not another module")
        if trainer.world_size > 1:
            raise ValueError("SISABackbone trains its stages in one process: fit its ensemble without DDP")
        for hook in self._incoming.hooks:
            hook()
        loader = trainer.train_dataloader
        self._incoming.data = getattr(loader, "dataset", None)
        self._incoming.temporary = False
        super().on_train_start(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._incoming.data = None

    # -- state ---------------------------------------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "slices_per_experience": self.slices_per_experience,
            "epochs": list(self.epochs),
            "partition": self.partition,
            "aggregate": self.aggregate,
            "trunk": self.trunk,
            "ridge": self.ridge,
            "feature_dtype": str(self.feature_dtype),
            "num_classes": self.num_classes,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        sisa = self._sisa
        state["sisa"] = {
            **self._settings(),
            "stages": [
                {
                    "experience": st.experience,
                    "ids": [i.clone() for i in st.ids],
                    "labels": [y.clone() for y in st.labels],
                }
                for st in sisa.stages
            ],
            "states": [[dict(s) for s in states] for states in sisa.states],
            "temporary": list(sisa.temporary),
            "head": None if sisa.head is None else sisa.head.clone(),
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the catalog and the stages and states (the ensemble gets the last states and the head); the
        experiences' data and the head's feature cache are not in it: pass ``data=`` to requests that retrain (with
        the head, the first request computes every shard's features of the retained samples again).

        Raises:
            ValueError: other settings (shards, slices, epochs, partition, head, feature dtype, classes, batch size,
                seed; a state without a feature dtype is one of float64 features), states that do
                not fit the module, or a malformed state; nothing is changed.
        """
        saved = state_dict.get("sisa")
        if not isinstance(saved, Mapping):
            raise ValueError("refusing SISABackbone state: it holds no 'sisa' entry")
        older = {"feature_dtype": str(torch.float64)}  # states saved before the setting existed: float64 features
        differ = [k for k, v in self._settings().items() if saved.get(k, older.get(k)) != v]
        if differ:
            raise ValueError(f"refusing SISABackbone state: its {differ} differ from this one's ({self._settings()})")
        stages = tuple(
            Stage(int(st["experience"]), tuple(torch.as_tensor(i, dtype=torch.long) for i in st["ids"]),
                  tuple(torch.as_tensor(y, dtype=torch.long) for y in st["labels"]))
            for st in saved["stages"]
        )  # fmt: skip
        states = tuple(tuple(dict(s) for s in shard) for shard in saved["states"])
        expected = {k: tuple(v.shape) for k, v in self.template.state_dict().items()}
        if len(states) != self.shards or any(len(shard) != len(stages) + 1 for shard in states):
            raise ValueError(
                f"refusing SISABackbone state: {len(states)} shards of states for {len(stages)} stages, expected "
                f"{self.shards} shards of {len(stages) + 1}"
            )
        if any({n: tuple(v.shape) for n, v in s.items()} != expected for shard in states for s in shard):
            raise ValueError("refusing SISABackbone state: a stored state does not fit the module's state_dict")
        super().load_state_dict(state_dict)
        head = saved.get("head")
        change = SISAChange(SISAState(stages, states, tuple(saved["temporary"]), head), (), (), 0, 0.0)
        self._data, self._where = [], {}
        weights = self.weights_of(change)
        if "head" in weights:
            self.ensemble.head.data = weights["head"]
        self.ensemble.load_state_dict({**self.ensemble.state_dict(), **weights})
        self._sisa = change.state


def _gram(F: Tensor, old: SISAState, kept: list[bool], removed: Tensor, added: Tensor) -> Tensor:
    """``F^T F`` by blocks of shards: the blocks between two shards whose rows were kept (``kept``) are the old ones
    less the products of the old rows ``removed`` plus those of the new rows ``added``; the others are computed."""
    if old.gram is None or not any(kept):
        return F.T @ F
    width = F.shape[1] // len(kept)
    cols = torch.arange(F.shape[1]).view(len(kept), width)
    same = torch.cat([cols[s] for s, k in enumerate(kept) if k])
    redo = torch.cat([cols[s] for s, k in enumerate(kept) if not k] or [same[:0]])
    gone, new = torch.cat([f[removed] for f in old.features], dim=1)[:, same], F[added][:, same]
    gram = torch.empty_like(old.gram)
    gram[same[:, None], same] = old.gram[same[:, None], same] - gone.T @ gone + new.T @ new
    if len(redo):
        cross = F[:, redo].T @ F
        gram[redo] = cross
        gram[:, redo] = cross.T
    return gram


def _holding(state: SISAState) -> set[int]:
    """The experiences with a sample in a slice of ``state``."""
    return {st.experience for st in state.stages if any(len(i) for i in st.ids)}


class _Empty(Dataset):
    """No data (retraining after a restore, without ``data=``: the first sample it needs is reported missing)."""

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)
