"""A Llama-family decoder-only transformer in plain PyTorch, in one readable file.

The architecture is the one of Llama 2 / TinyLlama: pre-norm residual blocks with RMSNorm,
rotary position embeddings, grouped-query attention and a SwiGLU MLP, no biases. Parameter
names and the rotary convention (rotate the two halves of each head, as Hugging Face and
GPT-NeoX do) are chosen so that a Hugging Face ``LlamaForCausalLM`` checkpoint maps onto this
model by renaming keys only (see ``hf_interop.py``).

Attention goes through ``torch.nn.functional.scaled_dot_product_attention`` with
``is_causal=True``, which dispatches to FlashAttention on GPUs. There is no document masking:
every token attends to all earlier tokens of its row, whatever the position ids say, exactly
as Hugging Face's model does when it is given position ids without an attention mask.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from lightning_modules.llama_settings import LlamaSettings


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain.

    Statistics are computed in fp32 (bf16 would lose precision in the mean of squares) and
    the result is cast back before the gain is applied, the same order as Hugging Face.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Unit gain: the norm starts as a pure normalisation."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.size(-1),), eps=self.eps)
        return self.weight * normed.type_as(x)


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for the given positions, in fp32, shaped ``[*position_ids.shape, head_dim]``.

    Computed from the positions on every forward (once, shared by all layers) instead of
    being read from a fixed-length cache: no maximum sequence length, rows whose positions
    restart work, and there is no buffer to lose when the model is built on the meta device.
    Frequency i is ``theta ** (-2i / head_dim)``; the angle table is repeated for both halves
    of the head (the half-rotation convention).
    """
    exponents = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / theta**exponents
    angles = position_ids.float().unsqueeze(-1) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each head's (first half, second half) dimension pairs by the position angle.

    The tables are cast to the activation dtype (a no-op in fp32), as Hugging Face does.
    """
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA for q: [b, H, T, d] and k, v: [b, H_kv, T, d], H a multiple of H_kv.

    Query head h reads k/v head h // (H / H_kv). In fp16/bf16, ``enable_gqa`` reaches
    FlashAttention's native grouped-query support, which never materialises repeated k/v.
    No fused kernel accepts ``enable_gqa`` in fp32 (SDPA silently falls back to its unfused
    math kernel), so in fp32 k/v are repeated explicitly and a fused kernel stays usable.
    """
    group = q.size(1) // k.size(1)
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.dtype == torch.float32:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class Attention(nn.Module):
    """Causal self-attention with grouped-query attention and rotary embeddings."""

    def __init__(self, config: LlamaSettings) -> None:
        super().__init__()
        self.n_heads = config.n_heads  # of the whole layer (a tensor-parallel rank holds n_heads / T)
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        kv_dim = config.n_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.k_proj = nn.Linear(config.d_model, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, kv_dim, bias=False)
        self.o_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x``: [b, T, d_model]; ``cos``/``sin``: [b or 1, 1, T, head_dim]."""
        b, t, _ = x.shape
        # -1: this rank's heads (all of them, or 1/T of them under tensor parallelism)
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = causal_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaSettings) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(config.mlp_hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaSettings) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


# Prefixes that wrappers insert into parameter names: activation checkpointing, torch.compile
# of a whole module, FSDP1. Seeds are derived from names without them.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_parameter_name(name: str) -> str:
    """The parameter's name in a bare ``Llama`` (as in its state dict), whatever wraps it."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one parameter.

    A cryptographic hash of (seed, name), not Python's ``hash`` (salted per process), so
    every rank and every run derives the same seed, and neighbouring seeds or names give
    unrelated streams.
    """
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seed_from_global_rng() -> int:
    """One initialisation seed drawn from torch's (CPU) global RNG.

    Drawn on the CPU whatever the default device, so ranks seeded alike (Lightning's
    ``seed_everything``) draw the same seed on any hardware, and building on the meta device
    first and drawing afterwards gives the seed that building on a real device would have.
    """
    return int(torch.randint(2**63 - 1, (), device="cpu"))


@torch.no_grad()
def init_parameter(param: torch.Tensor, name: str, std: float | None, seed: int) -> None:
    """Fill ``param`` with ones (``std`` None) or its N(0, std) draw for (seed, name).

    The full tensor is drawn in fp32 on the parameter's device, whatever the parameter's
    dtype or sharding, so a bf16 or sharded parameter holds exactly the rounding or the slice
    of the same values. For a DTensor, ``distribute_tensor(..., src_data_rank=None)`` cuts
    this rank's slice locally with DTensor's own placement rules (the ones FSDP2 shards
    with, uneven splits included); every rank drew the same full tensor, so nothing needs
    to be communicated. Peak memory: one full fp32 tensor besides the shards.
    """
    if std is None:
        param.fill_(1.0)
        return
    generator = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
    full = torch.empty(param.shape, dtype=torch.float32, device=param.device).normal_(0.0, std, generator=generator)
    if isinstance(param, DTensor):
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(full)


class Llama(nn.Module):
    """Token ids -> next-token logits. The loss lives in the training module."""

    #: Whether the head is split by vocabulary over a tensor-parallel group
    #: (``tensor_parallel.py``): the loss and its backward then run in ``loss_context``.
    vocabulary_parallel: bool = False
    #: The pieces the residual stream is split into along the sequence (sequence parallelism,
    #: ``tensor_parallel.py``): a later pipeline stage receives one piece of each row.
    sequence_shards: int = 1

    def __init__(self, config: LlamaSettings) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError(
                "LlamaSettings.vocab_size is None; set it from the tokenizer "
                "(e.g. dataclasses.replace(config, vocab_size=len(tokenizer))) before building Llama."
            )
        self.config = config
        # The seed is drawn before the submodules exist, whose default initialisation consumes
        # the global RNG on a real device, so that building on meta and drawing the seed
        # afterwards draws the same one. On meta nothing is drawn: meta builds (parameter
        # counts, export, meta init) must not shift the global RNG that ranks share.
        seed = None if torch.get_default_device().type == "meta" else seed_from_global_rng()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        # Keyed by block index (names ``layers.0`` ... as a list's): a pipeline stage keeps its
        # blocks under their own indices, so its parameters have the whole model's names.
        self.layers = nn.ModuleDict({str(index): TransformerBlock(config) for index in range(config.n_layers)})
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tie_weights()
        if seed is not None:
            self.init_weights(seed)

    def tie_weights(self) -> None:
        """With ``tie_embeddings``, make the output projection the very embedding Parameter.

        Called at construction; call it again after anything that replaces Parameter objects
        (``to_empty`` on a meta-device model, ``load_state_dict(..., assign=True)``), since
        those give the two modules separate Parameters.
        """
        if self.config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self, seed: int | None = None) -> None:
        """Initialise all weights from ``seed`` (None: one seed drawn from torch's global RNG,
        so ``torch.manual_seed(s); Llama(config)`` stays deterministic).

        Embeddings and linear weights are drawn from N(0, init_std). The two projections that
        write into the residual stream (``o_proj`` and ``down_proj``) use
        init_std / sqrt(2 * n_layers) instead (GPT-2 / Megatron scaled init): each block adds
        two such outputs to the stream, so without the scaling the residual's variance grows
        with depth and deep models start with exploding activations. Norm gains start at 1.

        Each parameter is drawn whole from its own generator, seeded from (seed, its name),
        and then written into the parameter or, for an FSDP2 DTensor, into this rank's shard
        (``init_parameter``). The values therefore depend on the seed, the names and the
        device's RNG only: not on the order of initialisation, on wrappers (checkpointing,
        compile, FSDP) or on how the parameters are sharded. That is what lets a model
        materialised from the meta device shard by shard (``meta_init.py``) equal one built
        whole on the same device.
        """
        if seed is None:
            seed = seed_from_global_rng()
        for name, param, std in self.init_plan():
            init_parameter(param, name, std, seed)

    def init_plan(self) -> list[tuple[str, nn.Parameter, float | None]]:
        """Every parameter once (a tied one under its first name), with its layout-independent
        name (``canonical_parameter_name``) and initial std; None means a gain of ones."""
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        gains = {id(p) for module in self.modules() if isinstance(module, RMSNorm) for p in module.parameters()}
        plan = []
        for wrapped_name, param in self.named_parameters():
            name = canonical_parameter_name(wrapped_name)
            if id(param) in gains:
                plan.append((name, param, None))
            else:
                writes_residual = name.endswith((".o_proj.weight", ".down_proj.weight"))
                plan.append((name, param, residual_std if writes_residual else std))
        return plan

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``input_ids``: [b, T] int64; ``position_ids``: [b, T] (default 0..T-1 in every row).

        Returns logits [b, T, vocab_size]; with ``labels`` ([b, T], -100 = not predicted),
        the mean next-token cross-entropy in fp32 instead, computed by ``loss_kernel``.
        The loss is taken inside ``forward`` so that a sharded model (FSDP) has the output
        projection gathered while a fused kernel uses it.

        A pipeline stage (``pipeline_parallel.py``) holds only its blocks: without the
        embedding it takes the previous stage's hidden states [b, T, d_model] in place of
        ``input_ids``, and without the head it returns its own.
        """
        if position_ids is None:  # the row's length, from the ids or a later stage's hidden states
            length = input_ids.size(1) * (1 if self.tok_embeddings is not None else self.sequence_shards)
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)
        h = input_ids if self.tok_embeddings is None else self.tok_embeddings(input_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.output is None:
            return h
        h = self.norm(h)
        if labels is None or self.loss_kernel is None:  # None: tensor parallelism (a head split by vocabulary)
            logits = self.output(h)
            if labels is None:
                return whole(logits)
            return whole(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()))
        return self.loss_kernel(h.flatten(0, 1), self.output.weight, labels.flatten())

    @staticmethod
    def loss_kernel(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``hidden @ weight.T`` in fp32 (the plain path: the logits exist whole).

        The layout may replace it on an instance with a fused kernel of the same signature
        (``lightning_modules/parallelism.py``).
        """
        return F.cross_entropy(F.linear(hidden, weight).float(), labels)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel head's output (a DTensor) as the plain tensor every rank would hold
    unsplit: the logits gathered, the loss as it is (replicated); differentiable."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def count_parameters(config: LlamaSettings, include_embedding: bool = True) -> int:
    """Number of unique parameters (tied weights once), counted on the meta device (no memory).

    ``include_embedding=False`` leaves out the input embedding table, the convention for
    MFU's 6N: a table lookup costs no matmul flops. With tied embeddings the same matrix is
    also the output projection, which does cost flops, so it stays counted.
    """
    with torch.device("meta"):
        model = Llama(config)
    total = sum(p.numel() for p in model.parameters())
    if not include_embedding and not config.tie_embeddings:
        total -= model.tok_embeddings.weight.numel()
    return total
