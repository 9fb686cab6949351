"""`SlicedBackbone`: a backbone trained by slices, so that forgetting retrains it exactly from the stage that first
saw the forgotten samples ([SISA]'s slicing, on one shard; ``docs/certified_head.md``, "Exact backbone retraining")."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset

from lightning_unlearn.contract import BatchKeys, trains_itself, unpack_batch
from lightning_unlearn.data import sample_ids_of
from lightning_unlearn.functional.sisa import sisa_epochs
from lightning_unlearn.progress import QUIET_TRAINER, quiet_lightning, status
from lightning_unlearn.warnings import warn

State = dict[str, Tensor]
#: Trainer options a stage cannot take: its epochs come from ``epochs=``, and it runs in this one process
_REFUSED_TRAINER_OPTIONS = ("max_epochs", "min_epochs", "max_steps", "strategy", "devices", "num_nodes")
__all__ = ["SliceRetrain", "SliceStates", "SlicedBackbone", "sisa_epochs", "train_stage"]


@dataclass(frozen=True)
class SliceStates:
    """The slices (sample ids, in training order) and the module's ``state_dict`` before stage 1 (``states[0]``, the
    initial weights) and after each stage ``k`` (``states[k]``, trained on slices ``1..k``)."""

    slices: tuple[Tensor, ...]
    states: tuple[State, ...]


@dataclass(frozen=True)
class SliceRetrain:
    """What forgetting ``ids`` changes in a :class:`SlicedBackbone`, computed before anything changes.

    Args:
        ids: the forgotten sample ids.
        stages: the new slices (``ids`` removed) and states (those before ``first_stage`` kept, the others retrained).
        first_stage: the first stage retrained (1-based): the first whose slices held one of ``ids``.
        retrained: the number of stages retrained (``S - first_stage + 1``).
        samples: the samples the retrained stages passed forward and backward (epochs times samples, summed over
            the stages): the cost in units that do not depend on the machine's load.
        seconds: the wall time of the retraining.
    """

    ids: Tensor
    stages: SliceStates
    first_stage: int
    retrained: int
    samples: int
    seconds: float


class SlicedBackbone(L.Callback):
    """Trains your backbone ``LightningModule`` by slices and forgets by retraining it exactly from the stage that first
    saw the forgotten samples ([SISA] Sec. IV-B, slicing, with one shard).

    The training ids are split into ``S`` slices; stage ``k`` trains the module, from its state after stage ``k - 1``,
    on slices ``1..k`` for ``epochs[k]`` epochs with your own ``training_step`` and ``configure_optimizers`` (a fresh
    optimizer per stage), in one Lightning fit seeded ``seed + k``. The ``state_dict`` before stage 1 and after every
    stage is kept, never a sample. Forgetting ``ids`` whose first slice is ``j`` restores the state before stage ``j``,
    removes ``ids`` from their slices and trains stages ``j..S`` again: the result equals training from scratch on the
    retained samples with the same slices, seeds and initial weights, provided every stage is deterministic (CPU
    kernels, the same threads and library versions: stated, not checkable). The proof, what breaks it and the costs:
    ``docs/certified_head.md``, "Exact backbone retraining by slices"; the sharded, stream-aligned form is
    :class:`~lightning_unlearn.callbacks.sisa.SISABackbone`. With
    :class:`~lightning_unlearn.unlearners.sliced.SlicedResolveUnlearner` the ``trunk`` feeds a certified softmax head.

    Args:
        module: your backbone's ``LightningModule`` with its own ``training_step`` and ``configure_optimizers``
            (e.g. a CNN trunk and a linear classifier trained end to end). Its weights when :meth:`fit` is called are
            the initial weights; after each fit or request it holds the state after the last stage.
        slices: the number ``S`` of slices (the ids of :meth:`fit`'s data are permuted with ``seed`` and split into
            ``S`` nearly equal parts), or the slices themselves (disjoint lists of sample ids, in training order).
        epochs: the epochs of every stage, or of each stage (``S`` non-negative numbers; :func:`sisa_epochs` gives
            [SISA]'s schedule).
        trunk: the submodule whose output the certified head reads (``None``: the whole module).
        batch_size: the training batch size.
        seed: the seed of the slices' permutation and of each stage (``seed + k``).
        batch_keys: the keys of dict batches (:class:`~lightning_unlearn.contract.BatchKeys`).
        trainer_kwargs: more ``L.Trainer`` options for every stage (e.g. ``deterministic``, ``precision``); epochs and
            multi-process options are refused.

    Raises:
        TypeError: ``module`` has no training recipe of its own.
        ValueError: bad slices, epochs, batch size or Trainer options; no submodule ``trunk``.

    Example::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_unlearn import IndexedDataset, SlicedBackbone, SupervisedClassifier
        >>> data = IndexedDataset(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))))
        >>> backbone = SlicedBackbone(SupervisedClassifier(torch.nn.Linear(4, 3)), slices=4, epochs=1, batch_size=8,
        ...                           trainer_kwargs={"enable_progress_bar": False})
        >>> backbone.fit(data)  # 4 stages, one Lightning fit each
        >>> [len(ids) for ids in backbone.stages.slices]
        [8, 8, 8, 8]
        >>> change = backbone.forget(backbone.stages.slices[2][:1], data)  # a sample of slice 3
        >>> change.first_stage, change.retrained, [len(ids) for ids in backbone.stages.slices]  # stages 3 and 4
        (3, 2, [8, 8, 7, 8])
    """

    def __init__(
        self,
        module: L.LightningModule,
        *,
        slices: int | Sequence[Sequence[int] | Tensor] = 4,
        epochs: int | Sequence[int] = 1,
        trunk: str | None = None,
        batch_size: int = 64,
        seed: int = 0,
        batch_keys: BatchKeys | None = None,
        trainer_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not trains_itself(module):
            raise TypeError(
                "SlicedBackbone trains the module with its own training_step and configure_optimizers: give a "
                f"LightningModule with both (automatic optimization), got {type(module).__name__}"
            )
        self.module = module
        self._given: tuple[Tensor, ...] | None = None
        if isinstance(slices, int):
            count = slices
        else:
            self._given = tuple(torch.as_tensor(s, dtype=torch.long).flatten() for s in slices)
            _check_disjoint(self._given)
            count = len(self._given)
        if count < 1:
            raise ValueError(f"SlicedBackbone needs at least one slice, got {count}")
        self.epochs = [int(epochs)] * count if isinstance(epochs, int) else [int(e) for e in epochs]
        if len(self.epochs) != count or min(self.epochs) < 0 or max(self.epochs) < 1:
            raise ValueError(
                f"SlicedBackbone epochs must be one number or one per slice ({count}), none negative and one at least "
                f"positive; got {epochs}"
            )
        if batch_size < 1:
            raise ValueError(f"SlicedBackbone batch_size must be at least 1, got {batch_size}")
        self.trainer_kwargs = dict(trainer_kwargs or {})
        refused = [k for k in _REFUSED_TRAINER_OPTIONS if k in self.trainer_kwargs]
        if refused:
            raise ValueError(
                f"SlicedBackbone trainer_kwargs cannot set {refused}: each stage's epochs are epochs=, and stages run "
                "in this process (a multi-process fit shuffles and reduces in an order this class does not replay)"
            )
        accelerator = str(self.trainer_kwargs.get("accelerator", "cpu"))
        if accelerator != "cpu" and not self.trainer_kwargs.get("deterministic"):
            warn(
                f"SlicedBackbone on accelerator {accelerator!r} without deterministic=True: non-deterministic kernels "
                "make a retrain differ from training from scratch, so forgetting is not exact; pass "
                "trainer_kwargs={'deterministic': True} (and CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA)"
            )
        self.trunk = trunk
        if trunk is not None:
            try:
                module.get_submodule(trunk)
            except AttributeError as err:
                raise ValueError(f"SlicedBackbone: the module has no submodule {trunk!r} (trunk=)") from err
        self.count, self.batch_size, self.seed, self.batch_keys = count, int(batch_size), int(seed), batch_keys
        self._stages: SliceStates | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(slices=self.count, seed=self.seed)

    # -- training ----------------------------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        return self._stages is not None

    @property
    def stages(self) -> SliceStates:
        """The current slices and states (``ValueError`` before :meth:`fit`)."""
        if self._stages is None:
            raise ValueError("SlicedBackbone is not trained yet: call fit(data) first")
        return self._stages

    @property
    def slice_ids(self) -> list[Tensor]:
        """The sample ids of each slice, in training order (copies)."""
        return [s.clone() for s in self.stages.slices]

    def fit(self, data: Dataset) -> None:
        """Train stages ``1..S`` on ``data`` (a dataset yielding ``(x, y, sample_id)`` or dicts) from the module's
        current weights, and keep every stage's state; the module ends with the state after stage ``S``.

        Raises:
            ValueError: already trained (a retrain is :meth:`forget`), repeated ids in ``data``, or given slices naming
                ids ``data`` lacks; nothing is changed.
        """
        if self._stages is not None:
            raise ValueError(
                "SlicedBackbone is already trained: forget(ids, data) retrains it; build a new one to start over"
            )
        ids = _ids_of(data, self.batch_keys)
        if self._given is not None:
            slices = self._given
        else:
            order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(self.seed))
            slices = tuple(s.clone() for s in torch.tensor_split(ids[order], self.count))
        rows = _rows(ids, torch.cat(slices))
        initial = _cloned(self.module.state_dict())
        states = self._train_from(initial, slices, 1, data, rows)
        self._restore(SliceStates(slices, (initial, *states)))

    def saw(self, ids: Tensor) -> Tensor:
        """A boolean mask of the ``ids`` this backbone was trained on (in one of its slices)."""
        return torch.isin(torch.as_tensor(ids, dtype=torch.long).cpu(), torch.cat(self.stages.slices))

    def retrain(self, ids: Tensor, data: Dataset) -> SliceRetrain:
        """Compute the backbone without ``ids``: stages ``j..S`` trained again from the state before stage ``j`` on the
        retained samples of their slices (``j`` the first slice holding one of ``ids``). Changes nothing: apply the
        result with :meth:`forget` (or through a strategy's commit).

        Raises:
            ValueError: some ``ids`` are not in any slice (unknown, or already forgotten), or ``data`` lacks retained
                ids (named); nothing is changed.
        """
        stages = self.stages
        ids = _learned_ids(ids, self.saw, "SlicedBackbone")
        first = next(k for k, s in enumerate(stages.slices) if bool(torch.isin(s, ids).any()))
        slices = tuple(s[~torch.isin(s, ids)] for s in stages.slices)
        rows = _rows(_ids_of(data, self.batch_keys), torch.cat(slices))
        start = perf_counter()
        states = self._train_from(stages.states[first], slices, first + 1, data, rows)
        seconds = perf_counter() - start
        kept = stages.states[: first + 1]  # the initial state and the states after stages 1..first: never saw ids
        new = SliceStates(slices, (*kept, *states))
        return SliceRetrain(ids, new, first + 1, self.count - first, self.cost(first + 1, new), seconds)

    def cost(self, first_stage: int = 1, stages: SliceStates | None = None) -> int:
        """The samples that stages ``first_stage..S`` pass forward and backward: ``sum_k epochs[k] |slices 1..k|``
        (with ``first_stage=1``, the whole sliced training), over ``stages`` (default: the current slices)."""
        sizes = torch.tensor([len(s) for s in (stages or self.stages).slices]).cumsum(0).tolist()
        return sum(e * n for e, n in zip(self.epochs[first_stage - 1 :], sizes[first_stage - 1 :]))

    def forget(self, ids: Tensor, data: Dataset) -> SliceRetrain:
        """Retrain without ``ids`` (:meth:`retrain`), keep the result and overwrite the replaced states.

        Raises:
            ValueError: as :meth:`retrain`; nothing is changed.
        """
        result = self.retrain(ids, data)
        replaced = self.stages
        self._restore(result.stages)
        self.erase(replaced)
        return result

    def _train_from(
        self, start: State, slices: tuple[Tensor, ...], first: int, data: Dataset, rows: Mapping[int, int]
    ) -> list[State]:
        """The states after stages ``first..S`` (1-based), stage ``first`` starting from ``start``."""
        states, state = [], start
        for k in range(first, self.count + 1):
            status(f"SlicedBackbone: stage {k} of {self.count} ({self.epochs[k - 1]} epoch(s))")
            state = self._stage(state, [rows[i] for s in slices[:k] for i in s.tolist()], data, k)
            states.append(state)
        return states

    def _stage(self, start: State, rows: list[int], data: Dataset, k: int) -> State:
        """Stage ``k``: :func:`train_stage` from ``start`` on ``data``'s ``rows`` for ``epochs[k - 1]`` epochs, seeded
        ``seed + k``."""
        return train_stage(
            self.module, start, rows, data, self.epochs[k - 1], self.batch_size, self.seed + k, self.trainer_kwargs
        )

    # -- state ---------------------------------------------------------------------------------------------------
    def restore(self, stages: SliceStates) -> Callable[[], None]:
        """Make ``stages`` the current slices and states (the module gets the last state); return the undo."""
        old = self._stages
        self._restore(stages)

        def undo() -> None:
            if old is not None:
                self._restore(old)

        return undo

    def _restore(self, stages: SliceStates) -> None:
        self.module.load_state_dict(stages.states[-1])
        self._stages = stages

    def erase(self, replaced: SliceStates) -> None:
        """Overwrite with zeros every tensor of ``replaced``'s states that the current states no longer hold (the
        states that saw forgotten samples)."""
        current = {id(t) for state in self.stages.states for t in state.values()}
        with torch.no_grad():
            for state in replaced.states:
                for t in state.values():
                    if id(t) not in current:
                        t.zero_()

    def trunk_state(self, state: State | None = None) -> State:
        """The ``trunk`` submodule's entries of ``state`` (default: the state after the last stage), names relative to
        the trunk."""
        state = self.stages.states[-1] if state is None else state
        if self.trunk is None:
            return dict(state)
        prefix = f"{self.trunk}."
        return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}

    def state_dict(self) -> dict[str, Any]:
        stages = self.stages if self._stages is not None else SliceStates((), ())
        return {
            "slices": [s.clone() for s in stages.slices],
            "states": [_cloned(s) for s in stages.states],
            "epochs": list(self.epochs),
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the slices and states (the module gets the last state) after checking them.

        Raises:
            ValueError: other epochs, batch size or seed (a retrain would follow another recipe), slices that are not
                disjoint or not ``S`` of them, not ``S + 1`` states, or states that do not fit the module; nothing is
                changed.
        """
        settings = {"epochs": self.epochs, "batch_size": self.batch_size, "seed": self.seed}
        differ = [k for k, v in settings.items() if state_dict.get(k) != v]
        if differ:
            raise ValueError(
                f"refusing SlicedBackbone state: its {differ} differ from this one's ({settings}); a retrain would not "
                "replay its training"
            )
        slices = tuple(torch.as_tensor(s, dtype=torch.long) for s in state_dict.get("slices", []))
        states = tuple(dict(s) for s in state_dict.get("states", []))
        if not slices and not states:
            self._stages = None
            return
        _check_disjoint(slices)
        if len(slices) != self.count or len(states) != self.count + 1:
            raise ValueError(
                f"refusing SlicedBackbone state: {len(slices)} slices and {len(states)} states, expected {self.count} "
                f"and {self.count + 1}"
            )
        expected = {k: tuple(v.shape) for k, v in self.module.state_dict().items()}
        for k, state in enumerate(states):
            shapes = {n: tuple(v.shape) for n, v in state.items()}
            if shapes != expected:
                raise ValueError(f"refusing SlicedBackbone state: state {k} does not fit the module's state_dict")
        self._restore(SliceStates(tuple(s.clone() for s in slices), tuple(_cloned(s) for s in states)))


def train_stage(
    module: L.LightningModule,
    start: State,
    rows: Sequence[int],
    data: Dataset,
    epochs: int,
    batch_size: int,
    seed: int,
    trainer_kwargs: Mapping[str, Any],
) -> State:
    """A copy of ``module`` from ``start`` trained on ``data``'s ``rows`` (in this order, shuffled by a generator seeded
    ``seed``) for ``epochs`` epochs in one Lightning fit of this process, the RNGs seeded ``seed`` (the caller's RNGs
    kept); its ``state_dict`` (``module`` is not touched). No rows or no epochs: ``start``'s values."""
    work = copy.deepcopy(module)
    work.load_state_dict(start)
    if rows and epochs:
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(Subset(data, list(rows)), batch_size=batch_size, shuffle=True, generator=generator)
        options = {
            **QUIET_TRAINER,
            "accelerator": "cpu",
            "devices": 1,  # in this process, also inside a DDP run (every rank then computes the same stages)
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            **trainer_kwargs,
            "max_epochs": epochs,
        }
        with quiet_lightning(), _seeded(seed):
            L.Trainer(**options).fit(work, loader)
    return _cloned(work.state_dict())


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """``L.seed_everything(seed)`` inside the block; the caller's RNG states and Lightning's seed variables kept."""
    saved = {k: os.environ.get(k) for k in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    try:
        with isolate_rng():
            L.seed_everything(seed, verbose=False)
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _learned_ids(ids: Tensor, saw: Callable[[Tensor], Tensor], owner: str) -> Tensor:
    """``ids`` as sorted unique CPU longs; ``ValueError`` naming those ``saw`` says no slice holds (unknown, or
    already forgotten)."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu().unique()
    unknown = ids[~saw(ids)]
    if unknown.numel():
        raise ValueError(
            f"{owner} was never trained on sample ids {unknown[:10].tolist()} (unknown, or already forgotten): "
            "nothing to retrain"
        )
    return ids


def _cloned(state: Mapping[str, Tensor]) -> State:
    return {k: v.detach().clone() for k, v in state.items()}


def _check_disjoint(slices: Sequence[Tensor]) -> None:
    ids = torch.cat(list(slices)) if slices else torch.zeros(0, dtype=torch.long)
    if len(ids.unique()) != len(ids):
        raise ValueError("SlicedBackbone slices must be disjoint lists of distinct sample ids")


def _ids_of(data: Dataset, keys: BatchKeys | None) -> Tensor:
    """The sample id of each row of ``data`` (``ValueError`` if an id repeats)."""
    ids = sample_ids_of(data)
    if ids is None:
        parts = [unpack_batch(b, keys)[2].cpu() for b in DataLoader(data, batch_size=512)]
        ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    ids = ids.long()
    if len(ids.unique()) != len(ids):
        raise ValueError("SlicedBackbone data repeats sample ids: give every sample a unique id")
    return ids


def _rows(ids: Tensor, wanted: Tensor) -> dict[int, int]:
    """``{id: row of data}`` for the ``wanted`` ids; ``ValueError`` naming the ones ``data`` lacks."""
    where = {int(i): r for r, i in enumerate(ids.tolist())}
    missing = [i for i in wanted.tolist() if i not in where]
    if missing:
        raise ValueError(f"SlicedBackbone data lacks {len(missing)} sample ids of its slices, e.g. {missing[:10]}")
    return {i: where[i] for i in wanted.tolist()}
