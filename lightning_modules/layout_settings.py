"""The ``layout`` section: how the model is laid out on devices, and every rule about it.

``parallelism.py`` applies a layout; this module holds its settings and their checks, so
that a layout setting and its rules live in one class: the choices (as the section is
built), the rules against the rest of the run (``check``: the strategy, the device type,
the model's shape for float8) and those against the machine (``check_services``: Liger
and torchao installed, float8 tensor cores, and the memory plan on a GPU).
"""

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError
from settings.run_context import RunContext
from settings.section import Section

if TYPE_CHECKING:
    from lightning_modules.memory_plan import MemoryPlan

log = logging.getLogger(__name__)

ACTIVATION_CHECKPOINTING = ("none", "full", "mlp")
COMPILE = ("none", "blocks", "model")
# Inductor's modes that keep the training step as it is (no CUDA graphs, which would need
# static input buffers): ``max-autotune-no-cudagraphs`` benchmarks Triton matmul and fusion
# configurations at compile time (minutes) for a faster step.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
LOSSES = ("plain", "chunked", "liger")
ATTENTION_BACKEND_NAMES = ("auto", "flash", "efficient", "cudnn", "math")
SHARDING_STRATEGIES = ("fsdp", "fsdp2")
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise")
# torch._scaled_mm needs both dimensions of every float8 matmul to be multiples of 16.
FLOAT8_DIM_MULTIPLE = 16
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")  # pipeline_parallel.SCHEDULES


@dataclass(kw_only=True)
class LayoutSettings(Section):
    """User settings (``layout`` in ``conf/train.yaml``, where their defaults live).

    - ``activation_checkpointing``: ``none``; ``full`` recomputes each transformer block in
      backward; ``mlp`` recomputes only the SwiGLU MLPs (their hidden activations are the
      largest per-token tensors, attention is kept).
    - ``checkpoint_every``: with checkpointing on, wrap every n-th block only (blocks 0, n,
      2n, ...): 1 wraps all; 2 keeps half the blocks' activations and recomputes the other
      half, between ``none`` and ``full`` in both memory and time (torchtitan's selective
      per-layer checkpointing).
    - ``compile``: ``none``; ``blocks`` compiles each transformer block (with dynamic shapes
      when a technique varies the sequence length, so lengths do not each recompile);
      ``model`` compiles the whole forward, loss included.
    - ``compile_mode``: Inductor's ``default``, or ``max-autotune-no-cudagraphs`` (autotunes
      matmuls and fusions while compiling: minutes more, sometimes a faster step).
    - ``reshard_after_forward``: FSDP2 only. True frees gathered parameters after forward
      (ZeRO-3 style); False keeps them until backward (ZeRO-2 style: more memory, one
      all-gather less per step).
    - ``fsdp_mixed_precision``: FSDP2 only. Gather parameters and compute in bf16, reduce
      gradients in fp32; the sharded master weights and the optimizer stay fp32.
    - ``attention_backend``: ``auto`` lets PyTorch pick the fastest SDPA kernel
      (FlashAttention on recent GPUs in bf16); ``flash``, ``efficient``, ``cudnn`` or
      ``math`` force one, and fail loudly where it cannot run.
    - ``loss``: ``plain`` computes the logits then the cross-entropy in fp32; ``chunked``
      fuses the output projection and the cross-entropy by chunks of tokens, so the fp32
      logits never exist whole (``fused_cross_entropy.py``); ``liger`` uses liger-kernel's
      Triton version (CUDA, ``pip install -e ".[gpu]"``).
    - ``liger_kernels``: route RMSNorm, SwiGLU and RoPE through liger-kernel (CUDA only).
    - ``fused_adamw``: AdamW's fused CUDA kernel (on CPU: the multi-tensor one).
    - ``float8``: ``none``; ``tensorwise`` or ``rowwise`` trains the blocks' linear layers in
      float8 through torchao (``float8.py``; H100/H200/L40S/L4, ``pip install -e ".[float8]"``).
    - ``float8_emulate``: run float8's casts with float32 matmuls (any device; tests).
    - ``sequence_parallel``: with ``strategy.tensor_parallel_size`` > 1, split the norms and
      the residual stream along the sequence too (``tensor_parallel.py``); no effect otherwise.
    - ``pipeline_schedule``: with ``strategy.pipeline_parallel_size`` > 1, how a step's
      micro-batches go through the stages: ``gpipe``, ``1f1b`` or ``interleaved_1f1b``
      (``pipeline_parallel.py``).
    - ``stages_per_rank``: the stages each pipeline rank holds: 1, or 2 and more for
      ``interleaved_1f1b``.
    """

    key = "layout"

    activation_checkpointing: str
    checkpoint_every: int
    compile: str
    compile_mode: str
    reshard_after_forward: bool
    fsdp_mixed_precision: bool
    attention_backend: str
    loss: str
    liger_kernels: bool
    fused_adamw: bool
    float8: str
    float8_emulate: bool
    sequence_parallel: bool
    pipeline_schedule: str
    stages_per_rank: int

    def __post_init__(self) -> None:
        for name, choices in (
            ("activation_checkpointing", ACTIVATION_CHECKPOINTING),
            ("compile", COMPILE),
            ("compile_mode", COMPILE_MODES),
            ("loss", LOSSES),
            ("attention_backend", ATTENTION_BACKEND_NAMES),
            ("float8", FLOAT8_RECIPES),
            ("pipeline_schedule", PIPELINE_SCHEDULES),
        ):
            if getattr(self, name) not in choices:
                raise ConfigError(f"layout.{name}={getattr(self, name)!r} is unknown; choose one of {choices}.")
        if self.checkpoint_every < 1:
            raise ConfigError(f"layout.checkpoint_every={self.checkpoint_every} must be >= 1 (1: every block).")

    @property
    def needs_liger(self) -> bool:
        return self.loss == "liger" or self.liger_kernels

    def check(self, run: RunContext) -> None:
        if run.strategy_name != "fsdp2" and not self.reshard_after_forward:
            raise ConfigError("layout.reshard_after_forward=false only applies to strategy=fsdp2.")
        if self.checkpoint_every > 1 and self.activation_checkpointing == "none":
            raise ConfigError(
                f"layout.checkpoint_every={self.checkpoint_every} has no effect with layout.activation_checkpointing=none;"
                " set layout.activation_checkpointing=full or mlp, or layout.checkpoint_every=1."
            )
        if self.checkpoint_every > run.model.n_layers:
            raise ConfigError(
                f"layout.checkpoint_every={self.checkpoint_every} exceeds model.n_layers={run.model.n_layers}: only"
                " block 0 would be checkpointed; choose at most the number of blocks."
            )
        self._check_float8(run)
        self._check_tensor_parallel(run)
        self._check_pipeline(run)

    def check_services(self, run: RunContext) -> None:
        self._check_float8_available()
        self._check_liger_available()
        self._check_device_memory(run)

    def gathers_bf16_weights(self, run: RunContext) -> bool:
        """Whether a mixed-precision policy computes with bf16 copies of the weights: FSDP1
        under a bf16 precision (Lightning's policy), FSDP2 with ``fsdp_mixed_precision``."""
        if run.strategy_name == "fsdp":
            return "bf16" in run.precision
        return run.strategy_name == "fsdp2" and self.fsdp_mixed_precision

    def memory_plan(self, run: RunContext) -> "MemoryPlan":
        """One device's memory on paper (``memory_plan.py``), each stage's weights sharded over
        every process that holds it under FSDP (services phase: the model's vocabulary comes
        from the tokenizer)."""
        from lightning_modules.memory_plan import PipelineShape, memory_plan  # torch (parameters counted on meta)

        fsdp = run.strategy_name in SHARDING_STRATEGIES
        stages = run.pipeline_parallel_size
        batch = run.global_batch
        pipeline = None
        if stages > 1 and batch is not None:
            pipeline = PipelineShape(stages, self.pipeline_schedule, self.stages_per_rank, batch.accumulation)
        return memory_plan(
            run.model_with_vocab(),
            precision=run.precision,
            optimizer=run.optimizer_kind,
            shards=run.world_size // stages if fsdp and run.world_size else 1,
            pipeline=pipeline,
            bf16_weights=self.gathers_bf16_weights(run),
            micro_batch=run.micro_batch_size,
            seq_len=run.seq_len,
            checkpointing=self.activation_checkpointing,
            checkpoint_every=self.checkpoint_every,
            loss=self.loss,
            tensor_parallel=run.tensor_parallel_size,
            sequence_parallel=run.sequence_shards > 1,
        )

    def _check_float8(self, run: RunContext) -> None:
        recipe = self.float8
        if recipe == "none":
            if self.float8_emulate:
                raise ConfigError(
                    "layout.float8_emulate=true has no effect with layout.float8=none; set layout.float8=tensorwise or rowwise."
                )
            return
        if run.strategy_name == "fsdp":
            raise ConfigError(
                f"layout.float8={recipe} does not compose with strategy=fsdp (FSDP1 flattens the weights torchao"
                " casts); use strategy=fsdp2."
            )
        if run.accelerator == "cpu" and not self.float8_emulate:
            raise ConfigError(
                f"layout.float8={recipe} on a CPU run needs float8 emulation: add layout.float8_emulate=true"
                " (for tests; it is slower than fp32), or set layout.float8=none."
            )
        model, split = run.model, run.tensor_parallel_size
        per_rank = " per tensor-parallel rank" if split > 1 else ""  # a rank's slice of each matrix
        dims = {
            f"model.d_model{per_rank}": model.d_model // split,
            f"model.n_kv_heads x head_dim{per_rank}": model.n_kv_heads * model.head_dim // split,
            f"model.mlp_hidden{per_rank}": model.mlp_hidden // split,
        }
        odd = {name: size for name, size in dims.items() if size % FLOAT8_DIM_MULTIPLE}
        if odd:
            listed = ", ".join(f"{name}={size}" for name, size in odd.items())
            raise ConfigError(
                f"layout.float8={recipe}: float8 matmuls need the blocks' linear dimensions to be multiples of"
                f" {FLOAT8_DIM_MULTIPLE}, but {listed}; choose such a model or set layout.float8=none."
            )

    def _check_tensor_parallel(self, run: RunContext) -> None:
        size = run.tensor_parallel_size
        if size == 1:
            return
        unsupported = {
            "layout.loss": (self.loss, "plain"),
            "layout.liger_kernels": (self.liger_kernels, False),
        }
        for key, (value, needed) in unsupported.items():
            if value != needed:
                raise ConfigError(
                    f"{key}={str(value).lower()} does not compose with strategy.tensor_parallel_size={size}"
                    f" (its kernels take whole matrices); set {key}={str(needed).lower()}."
                )
        if self.compile != "none":
            # Measured on 2 CPU processes (torch 2.13): compiled blocks under tensor parallelism took
            # gradients 24% (in norm) off one process's within 10 steps; until that is understood:
            raise ConfigError(
                f"layout.compile={self.compile} does not compose with strategy.tensor_parallel_size={size} yet (its"
                " gradients differed from one process's on CPU); set layout.compile=none."
            )
        if run.seq_len % run.sequence_shards:
            raise ConfigError(
                f"data.seq_len={run.seq_len} is not divisible by strategy.tensor_parallel_size={size}: sequence"
                f" parallelism splits each row into {size} equal parts; choose a multiple of {size}, or set"
                " layout.sequence_parallel=false."
            )

    def _check_pipeline(self, run: RunContext) -> None:
        interleaved = self.pipeline_schedule == "interleaved_1f1b"
        if interleaved and self.stages_per_rank < 2:
            raise ConfigError(
                f"layout.pipeline_schedule=interleaved_1f1b needs layout.stages_per_rank >= 2 (it has"
                f" {self.stages_per_rank}); set 2 or more, or choose layout.pipeline_schedule=1f1b."
            )
        if not interleaved and self.stages_per_rank != 1:
            raise ConfigError(
                f"layout.stages_per_rank={self.stages_per_rank} needs layout.pipeline_schedule=interleaved_1f1b;"
                f" {self.pipeline_schedule} runs one stage per rank: set layout.stages_per_rank=1."
            )
        size = run.pipeline_parallel_size
        if size == 1:
            return
        stages = size * self.stages_per_rank
        if stages > run.model.n_layers:
            raise ConfigError(
                f"strategy.pipeline_parallel_size={size} x layout.stages_per_rank={self.stages_per_rank} = {stages}"
                f" stages, more than model.n_layers={run.model.n_layers} blocks; choose at most one stage per block."
            )
        if interleaved and run.model.n_layers % stages:
            raise ConfigError(
                f"layout.pipeline_schedule=interleaved_1f1b: {stages} stages (strategy.pipeline_parallel_size={size} x"
                f" layout.stages_per_rank={self.stages_per_rank}) do not divide model.n_layers={run.model.n_layers}"
                " blocks, so the looped stages would be uneven; choose stages_per_rank so that they divide it."
            )
        unsupported = {
            "layout.loss": (self.loss, "plain"),
            "layout.compile": (self.compile, "none"),
            "layout.float8": (self.float8, "none"),
        }
        for key, (value, needed) in unsupported.items():
            if value != needed:
                raise ConfigError(
                    f"{key}={value} does not compose with strategy.pipeline_parallel_size={size} yet; set {key}={needed}."
                )
        batch = run.global_batch
        if batch is not None and batch.accumulation < size:
            bubble = (size - 1) / (batch.accumulation + size - 1)
            raise ConfigError(
                f"strategy.pipeline_parallel_size={size}: the global batch is {batch.accumulation} micro-batch(es)"
                f" per step, fewer than the {size} pipeline ranks, which would idle {bubble:.0%} of each step; give"
                f" each step at least {size} micro-batches (a smaller batch.micro_batch_size or a larger"
                " batch.global_batch_size)."
            )

    def _check_float8_available(self) -> None:
        from lightning_modules.float8 import float8_device_problem, torchao_available

        recipe = self.float8
        if recipe == "none":
            return
        problem = None if self.float8_emulate else float8_device_problem()
        if problem:
            raise ConfigError(
                f"layout.float8={recipe} needs float8 tensor cores (compute capability 8.9+: H100, H200, L40S, L4), but"
                f" {problem}; set layout.float8=none (or layout.float8_emulate=true, for tests)."
            )
        if not torchao_available():
            raise ConfigError(
                f'layout.float8={recipe} needs torchao: pip install -e ".[float8]"; or set layout.float8=none.'
            )

    def _check_liger_available(self) -> None:
        from lightning_modules.liger_kernels import liger_available

        if self.needs_liger and not liger_available():
            raise ConfigError(
                "layout.loss=liger and layout.liger_kernels=true need liger-kernel on a CUDA GPU"
                ' (pip install -e ".[gpu]"); elsewhere use layout.loss=chunked and layout.liger_kernels=false.'
            )

    def _check_device_memory(self, run: RunContext) -> None:
        """On a GPU run: refuse a model whose states cannot fit, and log the plan per device."""
        import torch

        from lightning_modules.memory_plan import check_fits

        if run.accelerator == "cpu" or not torch.cuda.is_available():
            return
        plan = self.memory_plan(run)
        name, memory = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory
        check_fits(plan, run.model.name, name, memory)
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            log.info("memory plan per device (%s, %.1f GiB): %s", name, memory / 2**30, plan.describe())
