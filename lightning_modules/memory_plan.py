"""A run's device memory on paper: parameters, gradients, optimizer state, activations.

Checked as a GPU run starts, before any data is read or weight allocated: when the
parameters, gradients and optimizer state alone (a lower bound: nothing else is counted)
exceed the device's memory, the run cannot fit and is refused in one line. The activation
estimate is added to the plan that is logged, but never refuses a run (compile and the
SDPA kernel change it); ``docs/gpu_benchmark.md`` puts the plan beside a measured peak.

Bytes per parameter per device, the model sharded over ``shards`` devices (FSDP) or whole
(one device, DDP): weights and gradients in the parameters' dtype (fp32, or bf16 under
``bf16-true``), AdamW's two moments in the same dtype (Muon's momentum: one).

Activations per token of one micro-batch: what autograd saves of one Llama block, as
measured (``tests/test_memory_plan.py`` counts the saved tensors of a block; the rotary
tables, the norms' statistics and attention's log-sum-exp, a few percent at small widths,
are left out). With d = d_model, h = MLP hidden, c the compute dtype's bytes and r the
residual stream's (4 under 32-true and under autocast over fp32 weights, which is
bf16-mixed unless a mixed-precision policy gathers bf16 weights; 2 under bf16-true and
under such a policy: FSDP1's bf16-mixed, FSDP2 with ``layout.fsdp_mixed_precision``):

- each of the two norms keeps its input in fp32 (4d) and its normalised output (rd);
- the inputs of attention's and the MLP's first matmuls are kept whole (2cd; 5cd under
  autocast over fp32 weights, which casts a copy for each of q, k, v, gate and up);
- attention keeps q, k, v and its output (c(2d + 2k), k the key-value width; in fp32 the
  key-value heads are repeated to the query heads' width, k = d), the MLP its gate, up, SiLU
  and product (4ch).

Under tensor parallelism over T ranks, attention and the MLP keep 1/T of theirs (their heads
and hidden units are split); the norms keep 1/T only with sequence parallelism, and the
matmuls' inputs stay whole either way (PyTorch's sequence parallelism saves the gathered
input). Checkpointing keeps each block's input instead (``full``: rd, 1/T under sequence
parallelism) or drops the MLP's part (``mlp``), plus one block's activations being
recomputed; with ``checkpoint_every`` n, only the blocks 0, n, 2n, ... are checkpointed and
the others keep everything. The loss adds the fp32 logits and their gradient (``plain``: 10
bytes per vocabulary entry, 1/T of the vocabulary under tensor parallelism, whose loss is
taken on the split logits) or a chunk's worth (``chunked``, ``liger``).
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


@dataclass(frozen=True)
class ActivationLayout:
    """How a micro-batch's activations are kept: their dtypes and the tensor-parallel split."""

    compute_bytes: int
    residual_bytes: int
    #: autocast over fp32 weights (bf16-mixed without FSDP): each matmul casts its own copy of its input
    casts_inputs: bool = False
    tensor_parallel: int = 1
    sequence_parallel: bool = False

    @classmethod
    def of(
        cls, precision: str, bf16_weights: bool = False, tensor_parallel: int = 1, sequence_parallel: bool = False
    ) -> "ActivationLayout":
        """The layout of a Lightning ``precision``; ``bf16_weights``: an FSDP mixed-precision
        policy gathers the weights in bf16 (FSDP1 under bf16-mixed, FSDP2 with
        ``layout.fsdp_mixed_precision``), so the residual stream is bf16 as under bf16-true."""
        autocast_over_fp32 = precision == "bf16-mixed" and not bf16_weights
        fp32 = precision == "32-true" and not bf16_weights
        return cls(
            compute_bytes=4 if fp32 else 2,
            residual_bytes=4 if fp32 or autocast_over_fp32 else 2,
            casts_inputs=autocast_over_fp32,
            tensor_parallel=tensor_parallel,
            sequence_parallel=sequence_parallel and tensor_parallel > 1,
        )

    @property
    def sequence_shards(self) -> int:
        return self.tensor_parallel if self.sequence_parallel else 1


def block_activation_bytes(model: LlamaSettings, layout: ActivationLayout, checkpointing: str = "none") -> float:
    """What backward keeps of one block per token of a micro-batch (module docstring)."""
    d, h, c, t = model.d_model, model.mlp_hidden, layout.compute_bytes, layout.tensor_parallel
    repeated = c == 4 and model.n_kv_heads != model.n_heads  # fp32 attention repeats the key-value heads
    k = d if repeated else model.n_kv_heads * model.head_dim
    norms = 2 * (4 + layout.residual_bytes) * d / layout.sequence_shards
    matmul_inputs = (5 if layout.casts_inputs else 2) * c * d  # q, k, v, gate, up: one cast each
    attention = c * (2 * d + 2 * k) / t
    mlp = 4 * c * h / t
    kept = {
        "none": norms + matmul_inputs + attention + mlp,
        "mlp": norms + matmul_inputs + attention,
        "full": layout.residual_bytes * d / layout.sequence_shards,
    }
    return kept[checkpointing]


def activation_bytes_per_token(
    model: LlamaSettings, checkpointing: str, loss: str, layout: ActivationLayout, checkpoint_every: int = 1
) -> float:
    """What backward keeps per token of a micro-batch, over the whole model (module docstring)."""
    block = block_activation_bytes(model, layout)
    kept = block_activation_bytes(model, layout, checkpointing)
    recomputed = 0 if checkpointing == "none" else block
    checkpointed = -(-model.n_layers // checkpoint_every)  # blocks 0, n, 2n and so on: ceil(n_layers / n)
    blocks = checkpointed * kept + (model.n_layers - checkpointed) * block
    head = 10 * model.vocab_size / layout.tensor_parallel if loss == "plain" else 4 * model.d_model
    return blocks + recomputed + head


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
    bf16_weights: bool = False,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
) -> MemoryPlan:
    """The plan of one device of a run (``shards``: devices the weights are split over, data
    and tensor parallel together; ``bf16_weights``: see ``ActivationLayout.of``)."""
    weight_bytes = 2 if precision == "bf16-true" else 4
    layout = ActivationLayout.of(precision, bf16_weights, tensor_parallel, sequence_parallel)
    per_device = count_parameters(model, include_embedding=True) / shards
    return MemoryPlan(
        parameters=per_device * weight_bytes,
        gradients=per_device * weight_bytes,
        optimizer=per_device * weight_bytes * OPTIMIZER_STATES.get(optimizer, 2),
        activations=micro_batch
        * seq_len
        * activation_bytes_per_token(model, checkpointing, loss, layout, checkpoint_every),
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
