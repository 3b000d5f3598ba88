"""Every node must see the run folder: the ranks write their checkpoint shards into it.

A run folder on a node's local disk (``/tmp``, a scratch directory, or a ``hydra.run.dir``
each node was given differently) splits a sharded checkpoint across machines: every save
looks fine, and the resume fails or, worse, reads another run's shards. Nodes cannot see
each other's disks before the process group exists, so this is checked as training is set
up: rank 0 writes a file into the folder, and every rank looks for it.
"""

import os
import socket
from pathlib import Path

import lightning as L
import torch

from common.errors import UserError

MARK = ".nodes_share_this_folder"


class SharedRunFolder(L.Callback):
    """Refuses, on every rank, a multi-node run whose ranks do not all see rank 0's run folder."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.num_nodes == 1 or trainer.world_size == 1:
            return
        folder = Path(trainer.default_root_dir)
        mark = folder / MARK
        token = f"{socket.gethostname()} {os.getpid()}"
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
            mark.write_text(token)
        token = trainer.strategy.broadcast(token, src=0)
        sees = mark.is_file() and mark.read_text() == token
        seen = trainer.strategy.all_gather(torch.tensor([float(sees)]))
        blind = [rank for rank, flag in enumerate(seen.flatten().tolist()) if not flag]
        trainer.strategy.barrier()
        if trainer.is_global_zero:
            mark.unlink(missing_ok=True)
        if blind:
            raise UserError(
                f"the run folder {folder} is not shared by the nodes: rank(s) {blind} do not see what rank 0"
                " wrote there, and each rank writes its checkpoint shard into it; give hydra.run.dir a folder"
                " on a file system every node mounts (the same path on each)."
            )
