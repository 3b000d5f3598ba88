"""The replicas a process holds: all M taking turns (simulated), or its own shard of one (real).

Simulated replicas each keep their own weights and inner optimizer state; a turn points the
live parameters and the optimizer at one replica's (by pointer, no copies). Real replicas
are groups of W / M ranks on a (replica, shard) mesh: FSDP2 shards only along ``shard``,
so inner steps never communicate across replicas, and the exchange runs over ``replica``.
"""

from collections import defaultdict
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lightning_modules.sharded_sums import local


class Replicas:
    """The weights (and inner optimizer states) of the replicas held by this process."""

    def __init__(self, parameters: list[nn.Parameter], optimizer: torch.optim.Optimizer, held: int) -> None:
        self.parameters, self.optimizer = parameters, optimizer
        self.weights = [[local(p).data for p in parameters]]
        self.weights += [[w.clone() for w in self.weights[0]] for _ in range(1, held)]
        self.inner_states = [optimizer.state] + [defaultdict(dict) for _ in range(1, held)]

    def activate(self, replica: int) -> None:
        """Point the live parameters and optimizer state at one simulated replica's."""
        for parameter, weight in zip(self.parameters, self.weights[replica]):
            parameter.data = weight
        self.optimizer.state = self.inner_states[replica]

    def state_dict(self) -> list[dict[str, Any]]:
        """Every held replica's weights and inner optimizer state (this rank's shards)."""
        saved = []
        for weights, state in zip(self.weights, self.inner_states):
            inner = [
                {k: local(v).clone() if torch.is_tensor(v) else v for k, v in state.get(p, {}).items()}
                for p in self.parameters
            ]
            saved.append({"weights": [w.clone() for w in weights], "inner": inner})
        return saved

    def load_state_dict(self, saved: list[dict[str, Any]]) -> None:
        for weights, inner_state, replica in zip(self.weights, self.inner_states, saved):
            for weight, value in zip(weights, replica["weights"]):
                weight.copy_(value)
            for parameter, entries in zip(self.parameters, replica["inner"]):
                live = inner_state[parameter]
                for name, value in entries.items():
                    if name in live and torch.is_tensor(live[name]):
                        local(live[name]).copy_(value)
                    else:
                        live[name] = value.clone() if torch.is_tensor(value) else value


def replica_mesh(data_parallel: DeviceMesh, replicas: int) -> DeviceMesh:
    """A (replica, shard) mesh over the data-parallel ranks: W / M consecutive ranks per replica.
    Unflattened from the data-parallel mesh (not a new one), so that its shard dimension and a
    tensor-parallel dimension of the same root mesh can carry one parameter together."""
    shards = data_parallel.size() // replicas
    return data_parallel._unflatten(0, (replicas, shards), ("replica", "shard"))
