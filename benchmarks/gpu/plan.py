"""What one call runs: the GPU plan, or the CPU smoke plan that checks the suite itself."""

from dataclasses import dataclass

import torch

from lightning_modules.liger_kernels import liger_available


@dataclass(frozen=True)
class Plan:
    """What one call runs: ``gpu_plan`` by default, ``quick_plan`` for the CPU smoke mode.

    ``work_micro_batch``, ``work_compile`` and ``work_kernels`` are the layout of the
    technique and overhead runs: micro-batches of 4 so that DiLoCo's five extra fp32 copies
    of TinyLlama (22 GB) still fit beside the activations on an 80 GB card, and Inductor's
    norm/SwiGLU/RoPE rather than Liger's, which Dynamo cannot compile with the dynamic
    shapes of sequence-length warmup (every technique run then has the baseline's kernels).
    ``kernel_layout`` (micro-batch, checkpointing, compile) is where the kernels section
    compares kernels: the fastest TinyLlama layout of the first H100 run.
    ``base`` names AdamW (TinyLlama's optimizer, and the one every recorded table ran), not
    the CPU default recipe's Muon.
    ``correctness_lr`` is TinyLlama's pretraining peak LR: the AdamW recipe's 8e-3 (a
    0.8M model's) makes a 300M model's loss jump about within 20 steps, where any
    difference in rounding grows into a large loss difference and the checks test chaos.
    ``float8`` holds what float8 needs here (nothing on an H100; torchao's emulation on CPU);
    ``float8_loss_steps`` is the length of the float8-against-bf16 loss comparison.
    ``large_model`` at ``large_seq_len`` is the single-device fit (Llama-2-7B at 4096 tokens
    on the GPU), in micro-batches of each of ``large_micro_batches``.
    ``tp_models`` at ``tp_seq_len`` are split over each of ``tp_sizes`` devices (tensor
    parallelism, one data-parallel group), in micro-batches of each of ``tp_micro_batches``,
    under each of ``tp_checkpointing``.
    """

    name: str
    device: str
    base: tuple[str, ...]
    model: str
    small_models: tuple[str, ...]
    seq_len: int
    global_batch: int
    micro_batches: tuple[int, ...]
    work_micro_batch: int
    work_compile: str
    correctness_model: str
    correctness_batch: int
    correctness_lr: float
    precision: str
    kernels: tuple[str, ...]
    kernels_label: str
    work_kernels: tuple[str, ...]
    kernel_layout: tuple[int, str, str]
    float8: tuple[str, ...]
    float8_loss_steps: int
    large_model: str
    large_seq_len: int
    large_micro_batches: tuple[int, ...]
    tp_models: tuple[str, ...]
    tp_seq_len: int
    tp_sizes: tuple[int, ...]
    tp_micro_batches: tuple[int, ...]
    tp_checkpointing: tuple[str, ...]
    run_seconds: float
    compile_seconds: float


def without_liger_modules(kernels: tuple[str, ...]) -> tuple[str, ...]:
    """The same kernels with Inductor's (or eager) norm, SwiGLU and RoPE in place of Liger's."""
    return tuple("layout.liger_kernels=false" if item == "layout.liger_kernels=true" else item for item in kernels)


def kernel_choice(device: str) -> tuple[tuple[str, ...], str]:
    """The fused kernels of every throughput run: Liger's where they can run (CUDA with
    liger-kernel installed), else the chunked cross-entropy; AdamW's fused kernel (on CPU
    the multi-tensor one)."""
    if device == "cuda" and liger_available():
        return ("layout.loss=liger", "layout.liger_kernels=true", "layout.fused_adamw=true"), (
            "liger CE + liger norm/SwiGLU/RoPE + fused AdamW"
        )
    adamw = "fused AdamW" if device == "cuda" else "foreach AdamW"
    return ("layout.loss=chunked", "layout.liger_kernels=false", "layout.fused_adamw=true"), f"chunked CE + {adamw}"


def gpu_plan() -> Plan:
    """TinyLlama-1.1B and two smaller models in bf16 on one GPU (estimates: docs/gpu_benchmark.md)."""
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device here; the CPU smoke mode is --quick.")
    kernels, label = kernel_choice("cuda")
    return Plan(
        name="gpu",
        device="cuda",
        base=("trainer=gpu", "optimizer=adamw", "data.source.max_tokens=2000000"),
        model="tinyllama_1b",
        small_models=("micro_llama_300m", "diloco_35m"),
        seq_len=2048,
        global_batch=16,
        micro_batches=(4, 8),
        work_micro_batch=4,
        work_compile="blocks",
        correctness_model="micro_llama_300m",
        correctness_batch=4,
        correctness_lr=4e-4,
        precision="bf16-mixed",
        kernels=kernels,
        kernels_label=label,
        work_kernels=without_liger_modules(kernels),
        kernel_layout=(8, "none", "blocks"),
        float8=(),
        float8_loss_steps=200,
        large_model="llama2_7b",
        large_seq_len=4096,
        large_micro_batches=(2, 1),
        tp_models=("llama2_7b", "llama2_13b"),
        tp_seq_len=2048,
        tp_sizes=(1, 2, 4, 8),
        tp_micro_batches=(1, 2),
        tp_checkpointing=("full", "none"),
        run_seconds=15.0,
        compile_seconds=25.0,
    )


def quick_plan() -> Plan:
    """The tiny model stands in for every model, in fp32 on CPU: the same sections
    and tables, in minutes, to check the suite itself."""
    kernels, label = kernel_choice("cpu")
    return Plan(
        name="quick (CPU, fp32; model=tiny stands in for every model)",
        device="cpu",
        base=(
            "trainer.accelerator=cpu",
            "trainer.precision=32-true",
            "optimizer=adamw",
            "data.source.max_tokens=200000",
        ),
        model="tiny",
        small_models=("tiny", "tiny"),
        seq_len=64,
        global_batch=8,
        micro_batches=(2, 4),
        work_micro_batch=2,
        work_compile="none",
        correctness_model="tiny",
        correctness_batch=4,
        correctness_lr=4e-4,
        precision="32-true",
        kernels=kernels,
        kernels_label=label,
        work_kernels=without_liger_modules(kernels),
        kernel_layout=(4, "none", "none"),
        float8=("layout.float8_emulate=true",),
        float8_loss_steps=6,
        large_model="tiny",
        large_seq_len=128,
        large_micro_batches=(2, 1),
        tp_models=("tiny",),
        tp_seq_len=64,
        tp_sizes=(1, 2),
        tp_micro_batches=(2,),
        tp_checkpointing=("none",),
        run_seconds=5.0,
        compile_seconds=25.0,
    )
