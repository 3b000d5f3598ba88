"""How packed training rows are cut to the training sequence length d.

``truncate`` keeps the first d tokens of each row (inputs, labels and positions cut
together). ``reshape`` splits each row of length L into L // d rows of d tokens (the last
L % d tokens are dropped), so tokens per step stay nearly constant; without position ids,
positions restart in each new row. Rows no longer than d are left as they are.
"""

from collections.abc import Callable

import torch

Batch = dict[str, torch.Tensor]


def truncate(batch: Batch, length: int) -> Batch:
    if batch["input_ids"].shape[1] <= length:
        return batch
    return {key: value[:, :length] for key, value in batch.items()}


def reshape(batch: Batch, length: int) -> Batch:
    row = batch["input_ids"].shape[1]
    if row <= length:
        return batch
    keep = row // length * length
    return {key: value[:, :keep].reshape(-1, length) for key, value in batch.items() if key != "position_ids"}


CUTTERS: dict[str, Callable[[Batch, int], Batch]] = {"truncate": truncate, "reshape": reshape}
