"""A run's device memory on paper: parameters, gradients, optimizer state, activations.

Checked as a GPU run starts, before any data is read or weight allocated: when the
parameters, gradients and optimizer state alone (a lower bound: nothing else is counted)
exceed the device's memory, the run cannot fit and is refused in one line. The activation
estimate is added to the plan that is logged, but never refuses a run (compile and the
SDPA kernel change it); ``docs/gpu_benchmark.md`` puts the plan beside a measured peak.

Bytes per parameter per device, the model sharded over ``shards`` devices (FSDP) or whole
(one device, DDP): weights and gradients in the parameters' dtype (fp32, or bf16 under
``bf16-true``), AdamW's two moments in the same dtype (Muon's momentum: one).

Activations per token of one micro-batch, in the compute dtype (2 bytes under bf16),
counting what backward keeps of one Llama block (d = d_model, k = kv width, h = MLP
hidden): the two norms' inputs and outputs (4d), q, k, v (d + 2k), the attention output
(d), the MLP's gate, up, SiLU and product (4h) and the residual (d) -- 6d + 2k + 5h in
total with the down projection's input counted in the product. Checkpointing keeps each
block's input instead (``full``: d) or drops the MLP's part (``mlp``: 6d + 2k), plus one
block's activations being recomputed; with ``checkpoint_every`` n, only the blocks 0, n,
2n, ... are checkpointed and the others keep everything. The loss adds the fp32 logits and their gradient
(``plain``: 10 bytes per vocabulary entry: bf16 logits, fp32 copy and gradient) or a
chunk's worth (``chunked``, ``liger``).
"""

from dataclasses import dataclass

from common.errors import ConfigError
from lightning_modules.llama import LlamaSettings, count_parameters

GIB = 2**30
OPTIMIZER_STATES = {"adamw": 2, "muon": 1}  # values per parameter (Muon: a lower bound, its AdamW part has 2)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def states(self) -> float:
        """What must fit whatever the layout: weights, gradients, optimizer state."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations

    def describe(self) -> str:
        parts = (("parameters", self.parameters), ("gradients", self.gradients), ("optimizer state", self.optimizer))
        states = " + ".join(f"{name} {value / GIB:.1f}" for name, value in parts)
        return f"{states} = {self.states / GIB:.1f} GiB, + activations about {self.activations / GIB:.1f} GiB = {self.total / GIB:.1f} GiB"


def activation_bytes_per_token(
    model: LlamaSettings, checkpointing: str, loss: str, compute_bytes: int, checkpoint_every: int = 1
) -> float:
    """What backward keeps per token of a micro-batch (module docstring)."""
    d, k, h = model.d_model, model.n_kv_heads * model.head_dim, model.mlp_hidden
    block = 6 * d + 2 * k + 5 * h
    kept = {"none": block, "mlp": 6 * d + 2 * k, "full": d}[checkpointing]
    recomputed = 0 if checkpointing == "none" else block
    checkpointed = -(-model.n_layers // checkpoint_every)  # blocks 0, n, 2n and so on: ceil(n_layers / n)
    blocks = checkpointed * kept + (model.n_layers - checkpointed) * block
    head = 10 * model.vocab_size if loss == "plain" else 4 * d
    return compute_bytes * (blocks + recomputed) + head


def memory_plan(
    model: LlamaSettings,
    *,
    precision: str,
    optimizer: str,
    shards: int,
    micro_batch: int,
    seq_len: int,
    checkpointing: str,
    loss: str,
    checkpoint_every: int = 1,
) -> MemoryPlan:
    """The plan of one device of a run (``shards``: devices the weights are split over)."""
    weight_bytes = 2 if precision == "bf16-true" else 4
    compute_bytes = 2 if "bf16" in precision else 4
    per_device = count_parameters(model, include_embedding=True) / shards
    return MemoryPlan(
        parameters=per_device * weight_bytes,
        gradients=per_device * weight_bytes,
        optimizer=per_device * weight_bytes * OPTIMIZER_STATES.get(optimizer, 2),
        activations=micro_batch
        * seq_len
        * activation_bytes_per_token(model, checkpointing, loss, compute_bytes, checkpoint_every),
    )


def check_fits(plan: MemoryPlan, model_name: str, device_name: str, device_bytes: int) -> None:
    """Refuse a run whose weights, gradients and optimizer state alone exceed the device."""
    if plan.states > device_bytes:
        raise ConfigError(
            f"model={model_name} cannot fit: its parameters, gradients and optimizer state need"
            f" {plan.states / GIB:.1f} GiB per device ({plan.describe()}), more than the {device_name}'s"
            f" {device_bytes / GIB:.1f} GiB; shard it over more devices (strategy=fsdp2 trainer.devices=N) or use a"
            " device with more memory."
        )
