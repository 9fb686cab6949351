"""Each Avalanche training mini-batch's sample ids, while the strategy sees Avalanche's ``(x, y, t)``.

The :class:`UnlearningPlugin` hands the strategy a training dataset whose ``sample_id`` attribute is
read in ``__getitem__`` (Avalanche appends it: ``(x, y, t, id)``) and a loader wrapper,
:class:`IdsOffTheBatch`, that takes that last column off every collated batch before the strategy
reads it. The strategy, and every plugin, see ``mbatch = [x, y, t]`` (``mb_task_id`` is
``mbatch[-1]``, DER concatenates its replayed rows into positions 0-2); the plugin reads the ids
from the wrapper.

Replay mixes, in one collated batch, the training dataset's items with items of its buffer, which
Avalanche built from the experience's own dataset (``(x, y, t)``: the id is not in the item there).
The training dataset's ``collate_fn``, which Avalanche's multi-dataset loaders use for every item
(``ReplayDataLoader``, ``TaskBalancedDataLoader``), gives those items the id ``-1``:
:class:`IdCollate` recognises the plugin's ids by their type (:class:`SampleId`), so an item of any
other layout is never mistaken for one carrying an id. A row with id ``-1`` was replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from avalanche.benchmarks.utils import DataAttribute
from torch import Tensor

from lightning_unlearn.avalanche.benchmarks import SAMPLE_ID, sample_ids

#: the id of a row that carries none (a replayed sample, from a buffer built without the id in its items)
REPLAYED = -1


class SampleId(int):
    """A sample id as the training items carry it: an ``int`` whose type marks it as the plugin's."""


class IdCollate:
    """The training dataset's collate function: items without a :class:`SampleId` last get ``SampleId(-1)``.

    Args:
        collate: the dataset's own collate function, applied to the completed items.
    """

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, items: list[Any]) -> Any:
        return self.collate([_with_id(item) for item in items])


def _with_id(item: Any) -> Any:
    if isinstance(item[-1], SampleId):
        return item
    return [*item, SampleId(REPLAYED)]


def ids_in_items(dataset: Any) -> Any:
    """A copy of the Avalanche training dataset whose items end with their :class:`SampleId` and whose
    ``collate_fn`` is :class:`IdCollate` around the original one."""
    marked = DataAttribute([SampleId(i) for i in sample_ids(dataset).tolist()], SAMPLE_ID, use_in_getitem=True)
    view = dataset.update_data_attribute(SAMPLE_ID, marked)
    view.collate_fn = IdCollate(dataset.collate_fn)
    return view


class IdsOffTheBatch:
    """Wraps the strategy's training loader: yields each batch without its last column (the ids), kept in
    :attr:`ids` for the plugin. Other attributes are the wrapped loader's.

    Args:
        loader: the strategy's ``dataloader`` (a ``DataLoader`` or one of Avalanche's loaders).
        width: the number of columns of a batch that carries the ids.
    """

    def __init__(self, loader: Any, width: int) -> None:
        self.loader, self.width = loader, width
        self.ids: Tensor | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)

    def __iter__(self) -> Iterator[list[Any]]:
        for batch in self.loader:
            if not isinstance(batch, (list, tuple)) or len(batch) != self.width:
                raise ValueError(
                    f"UnlearningPlugin: a training batch has {len(batch) if isinstance(batch, (list, tuple)) else 0} "
                    f"columns, not the {self.width} of the experience's items with their sample ids: the strategy or "
                    "a plugin listed after UnlearningPlugin replaced the training data (e.g. GDumb); not supported"
                )
            *rest, ids = batch
            self.ids = torch.as_tensor(ids, dtype=torch.long)
            yield list(rest)
