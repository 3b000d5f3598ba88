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

Under pipeline parallelism over P ranks (``PipelineShape``) a rank holds its stages' blocks
(the first also the embedding, the last the final norm and the head) and keeps the
activations of as many micro-batches as its schedule has in flight at once: GPipe all m of
the step's; 1F1B min(m, P - r) on rank r (the first rank the most); interleaved 1F1B with v
stages per rank min(m v, (v - 1) P + 2 (P - 1 - r) + 1) stage-chunks of 1/v of its blocks
each (PyTorch's warm-up count plus the one being formed). The rank holding the first stage
keeps one micro-batch more through that stage's blocks: PyTorch 2.13's stage keeps the
graph of the forward it runs to learn its shapes (measured: 0.5 to 0.75 of a micro-batch
at d_model 32). The last stage takes its loss on logits gathered whole under tensor
parallelism. The plan is the rank that needs the most.
"""

from dataclasses import dataclass

from common.errors import ConfigError
from lightning_modules.llama import count_parameters
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.pipeline_stages import rank_stages, stage_blocks

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


@dataclass(frozen=True)
class PipelineShape:
    """A pipeline's ranks, schedule and stages per rank, and the micro-batches of a step."""

    ranks: int
    schedule: str
    stages_per_rank: int
    micro_batches: int

    def stages(self, rank: int) -> list[int]:
        return rank_stages(rank, self.ranks, self.stages_per_rank)

    def blocks(self, model: LlamaSettings, rank: int) -> list[int]:
        """The blocks rank ``rank`` holds."""
        every = stage_blocks(model.n_layers, self.ranks * self.stages_per_rank)
        return [block for stage in self.stages(rank) for block in every[stage]]

    def first_stage_blocks(self, model: LlamaSettings) -> list[int]:
        return list(stage_blocks(model.n_layers, self.ranks * self.stages_per_rank)[0])

    def in_flight(self, rank: int) -> float:
        """Micro-batches whose activations rank ``rank`` keeps at once, in micro-batches
        through all its blocks (module docstring)."""
        m, p, v = self.micro_batches, self.ranks, self.stages_per_rank
        if self.schedule == "gpipe":
            return m
        if self.schedule == "1f1b":
            return min(m, p - rank)
        return min(m * v, (v - 1) * p + 2 * (p - 1 - rank) + 1) / v


def activation_bytes_per_token(
    model: LlamaSettings,
    checkpointing: str,
    loss: str,
    layout: ActivationLayout,
    checkpoint_every: int = 1,
    blocks: list[int] | None = None,
    head: bool = True,
) -> float:
    """What backward keeps per token of a micro-batch, over the whole model or the ``blocks``
    of a pipeline rank (with the ``head`` if it holds the last stage; module docstring)."""
    blocks = list(range(model.n_layers)) if blocks is None else blocks
    block = block_activation_bytes(model, layout)
    kept = block_activation_bytes(model, layout, checkpointing)
    recomputed = 0 if checkpointing == "none" or not blocks else block
    checkpointed = sum(1 for index in blocks if index % checkpoint_every == 0)  # blocks 0, n, 2n and so on
    total = checkpointed * kept + (len(blocks) - checkpointed) * block + recomputed
    if not head:
        return total
    split = layout.tensor_parallel if len(blocks) == model.n_layers else 1  # a pipeline's last stage gathers
    return total + (10 * model.vocab_size / split if loss == "plain" else 4 * model.d_model)


def stage_parameters(model: LlamaSettings, pipeline: PipelineShape, rank: int) -> float:
    """The parameters a pipeline rank holds (untied embeddings: pipelines refuse tied ones)."""
    embedding = model.vocab_size * model.d_model
    per_block = (count_parameters(model, include_embedding=True) - 2 * embedding - model.d_model) / model.n_layers
    stages = pipeline.stages(rank)
    first, last = 0 in stages, pipeline.ranks * pipeline.stages_per_rank - 1 in stages
    return len(pipeline.blocks(model, rank)) * per_block + first * embedding + last * (embedding + model.d_model)


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
    pipeline: PipelineShape | None = None,
    pipeline_rank: int | None = None,
) -> MemoryPlan:
    """The plan of one device of a run (``shards``: devices one stage's weights are split over,
    data and tensor parallel together; ``bf16_weights``: see ``ActivationLayout.of``); under
    a pipeline, of ``pipeline_rank``, or of the rank that needs the most."""
    layout = ActivationLayout.of(precision, bf16_weights, tensor_parallel, sequence_parallel)
    if pipeline is None:
        parameters = count_parameters(model, include_embedding=True)
        per_token = activation_bytes_per_token(model, checkpointing, loss, layout, checkpoint_every)
        return _plan(parameters / shards, per_token * micro_batch * seq_len, precision, optimizer)
    plans = []
    for rank in range(pipeline.ranks) if pipeline_rank is None else [pipeline_rank]:
        last = pipeline.ranks * pipeline.stages_per_rank - 1 in pipeline.stages(rank)
        blocks = pipeline.blocks(model, rank)
        per_token = activation_bytes_per_token(model, checkpointing, loss, layout, checkpoint_every, blocks, head=False)
        activations = pipeline.in_flight(rank) * per_token * micro_batch * seq_len
        if rank == 0:  # the first stage's shape inference (module docstring)
            first = pipeline.first_stage_blocks(model)
            shaped = activation_bytes_per_token(model, checkpointing, loss, layout, checkpoint_every, first, head=False)
            activations += shaped * micro_batch * seq_len
        if last:  # the loss: every micro-batch's logits under GPipe, one at a time otherwise
            head = activation_bytes_per_token(model, checkpointing, loss, layout, blocks=[])
            logits = pipeline.micro_batches if pipeline.schedule == "gpipe" else 1
            activations += logits * head * micro_batch * seq_len
        plans.append(_plan(stage_parameters(model, pipeline, rank) / shards, activations, precision, optimizer))
    return max(plans, key=lambda plan: plan.total)


def _plan(parameters: float, activations: float, precision: str, optimizer: str) -> MemoryPlan:
    weight_bytes = 2 if precision == "bf16-true" else 4
    return MemoryPlan(
        parameters=parameters * weight_bytes,
        gradients=parameters * weight_bytes,
        optimizer=parameters * weight_bytes * OPTIMIZER_STATES.get(optimizer, 2),
        activations=activations,
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
