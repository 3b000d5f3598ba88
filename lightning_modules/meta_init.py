"""Build a Llama without any rank ever holding it whole: meta device, layout, then init shard by shard.

Building in fp32 on every rank before sharding costs 4 bytes per parameter per rank (52 GB
for Llama-2 13B), more than a GPU holds. Instead the model is built on the meta device
(shapes only), laid out (activation checkpointing, compile, FSDP2 ``fully_shard``), and only
then given storage: ``materialize_and_init`` allocates this rank's shards and fills them
parameter by parameter, so the peak is about this rank's shards plus one full parameter.

The values are those of ``Llama.init_weights`` with the same seed (each parameter is drawn
whole from a generator seeded from (seed, name), then sliced), so a model built this way
equals one built whole on the same device type, sharded or not::

    torch.manual_seed(s)                     # as Lightning's seed_everything does on every rank
    with torch.device("meta"):
        model = Llama(config)                # draws nothing from the global RNG
    apply_layout(model, layout, mesh)        # checkpointing, compile, fully_shard
    materialize_and_init(model, device, seed_from_global_rng())
    # == torch.manual_seed(s); Llama(config) on ``device``, then the same layout

FSDP1 (Lightning's ``FSDPStrategy``) materialises modules itself and only asks for a
``param_init_fn``: ``fsdp1_param_init_fn`` gives one with the same values.
"""

from collections.abc import Callable

import torch
from torch import nn

from lightning_modules.llama import Llama, init_parameter


def materialize_and_init(model: Llama, device: torch.device, seed: int) -> None:
    """Give a meta-device ``model`` (laid out or not) storage on ``device`` and initialise it.

    Call it after ``fully_shard``: ``to_empty`` then allocates only each DTensor's local
    shard. Tied embeddings are re-tied before initialising (``to_empty`` unties plain
    Parameters; FSDP2 swaps DTensors in place and keeps them tied), so the shared matrix is
    drawn once, under its first name, exactly as at construction.
    """
    model.to_empty(device=device)
    model.tie_weights()
    model.init_weights(seed)


def fsdp1_param_init_fn(model: Llama, seed: int, device: torch.device | None = None) -> Callable[[nn.Module], None]:
    """A ``param_init_fn`` for FSDP1 that materialises ``model``'s meta parameters on
    ``device`` (None: the current CUDA device, at call time) with ``init_weights``' values.

    FSDP1 calls it on every not-yet-wrapped submodule, one at a time and without the
    module's path, so the parameters' names and stds are read from ``model`` now, while it
    is still on meta and unwrapped; pass it as ``wrap(model, param_init_fn=...)`` or to
    ``FSDP(model, param_init_fn=...)``. The plan keeps the meta Parameters alive, so their
    ids stay unique. A tied Parameter reached again through a second module is given the
    tensor already materialised, which keeps the embedding and output projection tied.
    """
    plan = {id(param): (param, name, std) for name, param, std in model.init_plan()}
    materialized: dict[int, nn.Parameter] = {}

    def init_module(module: nn.Module) -> None:
        target = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        for key, param in list(module.named_parameters(recurse=False)):
            if id(param) not in materialized:
                if not param.is_meta:
                    continue
                _, name, std = plan[id(param)]
                new = nn.Parameter(torch.empty_like(param, device=target), requires_grad=param.requires_grad)
                init_parameter(new, name, std, seed)
                materialized[id(param)] = new
            setattr(module, key, materialized[id(param)])

    return init_module
