"""Model FLOPs per token and the peak throughput of devices, for MFU and HFU.

Model FLOPs per token follow the PaLM convention (Chowdhery et al. 2022, appendix B):

    F = 6 N + 12 L H Q T

N: parameters that take part in matrix multiplies, L layers, H query heads, Q head
dimension, T the sequence length trained on now. 6N is forward (2N) plus backward (4N)
of every weight matmul; 12 L H Q T is the attention scores and weighted sum (QK^T and
AV), forward and backward, with no discount for causal masking. By default N leaves out
the input embedding table, because a lookup multiplies nothing; the output head (tied
or not) is a matmul and counts. ``include_embedding=True`` adds the table, as some
papers do.

HFU (hardware FLOPs utilisation) also counts work that activation checkpointing
recomputes: one more forward of every checkpointed block (``full``) or MLP (``mlp``).
"""

from lightning_modules.llama import count_parameters
from lightning_modules.llama_settings import LlamaSettings

# Dense bf16 peak FLOP/s per device (no structured sparsity), from the vendors' data sheets,
# by the exact name ``torch.cuda.get_device_name`` reports: a substring match would give an
# L40S the L4's peak. Other devices log no MFU unless ``peak_flops_per_device`` is set.
PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989e12,  # H100 SXM
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA H200 NVL": 835e12,
    "NVIDIA GH200 480GB": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10": 125e12,
}


# Dense float8 (e4m3) peak FLOP/s of the devices with float8 tensor cores, from the same
# data sheets: twice the bf16 peak. A float8 run's MFU stays against the bf16 peak (the
# usual convention: the model's FLOPs, the device's headline precision); this one is shown
# beside it, for how far the float8 matmuls are from their own ceiling.
FLOAT8_PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 1979e12,
    "NVIDIA H100 PCIe": 1513e12,
    "NVIDIA H100 NVL": 1671e12,
    "NVIDIA H200": 1979e12,
    "NVIDIA H200 NVL": 1671e12,
    "NVIDIA GH200 480GB": 1979e12,
    "NVIDIA L40S": 733e12,
    "NVIDIA L4": 242.5e12,
}


def _block_parameters(config: LlamaSettings) -> tuple[int, int]:
    """Parameters of one block's attention projections and of its MLP."""
    kv_dim = config.n_kv_heads * config.head_dim
    attention = 2 * config.d_model * config.d_model + 2 * config.d_model * kv_dim
    mlp = 3 * config.d_model * config.mlp_hidden
    return attention, mlp


def matmul_parameters(config: LlamaSettings, include_embedding: bool = False) -> int:
    """N of the formula: the model's parameters less its RMSNorm gains (and input table)."""
    norm_gains = (2 * config.n_layers + 1) * config.d_model
    return count_parameters(config, include_embedding=include_embedding) - norm_gains


def attention_flops_per_token(config: LlamaSettings, seq_len: int) -> int:
    """12 L H Q T: attention scores and values, forward and backward."""
    return 12 * config.n_layers * config.n_heads * config.head_dim * seq_len


def model_flops_per_token(config: LlamaSettings, seq_len: int, include_embedding: bool = False) -> int:
    """F = 6 N + 12 L H Q T."""
    return 6 * matmul_parameters(config, include_embedding) + attention_flops_per_token(config, seq_len)


def recomputed_flops_per_token(config: LlamaSettings, seq_len: int, activation_checkpointing: str) -> int:
    """Forward FLOPs that activation checkpointing runs a second time, per token."""
    attention, mlp = _block_parameters(config)
    if activation_checkpointing == "full":
        return config.n_layers * 2 * (attention + mlp) + attention_flops_per_token(config, seq_len) // 3
    if activation_checkpointing == "mlp":
        return config.n_layers * 2 * mlp
    return 0


def peak_flops(device_name: str) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device by its exact name (e.g. 'NVIDIA H100 80GB HBM3'), or None."""
    return PEAK_FLOPS.get(device_name.strip())


def float8_peak_flops(device_name: str) -> float | None:
    """Dense float8 peak FLOP/s of a CUDA device by its exact name, or None."""
    return FLOAT8_PEAK_FLOPS.get(device_name.strip())
