"""The ``model`` section: a Llama model's shape and numerics, checked as the config is read.

Apart from the model (``llama.py``) so that reading and checking a config never loads torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError
from settings.section import Section

if TYPE_CHECKING:
    from settings.run_context import RunContext


# Llama rounds its SwiGLU width up to a multiple of 256 so the matmuls tile well on GPUs.
MLP_MULTIPLE_OF = 256


def default_mlp_hidden(d_model: int) -> int:
    """Llama's SwiGLU width: 2/3 of 4 * d_model (keeps the MLP's parameter count equal to a
    4x GELU MLP, since SwiGLU has three matrices), rounded up to ``MLP_MULTIPLE_OF``.

    Gives 11008 for d_model 4096 and 13824 for 5120, the published Llama-2 widths.
    """
    hidden = int(8 * d_model / 3)
    return MLP_MULTIPLE_OF * math.ceil(hidden / MLP_MULTIPLE_OF)


def _require_positive_int(name: str, value: object) -> None:
    """Reject zero, negative and non-integer sizes early, with the field named."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model.{name} must be a positive integer, got {value!r}; set {name} to a value >= 1.")


def _require_positive_float(name: str, value: object) -> None:
    """Reject non-positive scalars (theta, eps, std) that would silently break the model."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"model.{name} must be a positive number, got {value!r}; set {name} to a value > 0.")


@dataclass(kw_only=True)
class LlamaSettings(Section):
    """Shape and numerics of a Llama model.

    ``vocab_size`` may stay None in presets: the training code fills it in from the tokenizer
    before building the model. ``n_kv_heads`` None means standard multi-head attention
    (``n_heads``); ``mlp_hidden`` None means Llama's rule (``default_mlp_hidden``). Both are
    resolved in ``__post_init__``, so after construction they are always integers.
    """

    key = "model"

    name: str = "custom"
    vocab_size: int | None = None
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    mlp_hidden: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for field_name in ("n_layers", "d_model", "n_heads"):
            _require_positive_int(field_name, getattr(self, field_name))
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.mlp_hidden is None:
            self.mlp_hidden = default_mlp_hidden(self.d_model)
        _require_positive_int("n_kv_heads", self.n_kv_heads)
        _require_positive_int("mlp_hidden", self.mlp_hidden)
        if self.vocab_size is not None:
            _require_positive_int("vocab_size", self.vocab_size)
        for field_name in ("rope_theta", "norm_eps", "init_std"):
            _require_positive_float(field_name, getattr(self, field_name))
        self._check_head_layout()

    def _check_head_layout(self) -> None:
        """Heads must split d_model evenly, kv heads must split the query heads evenly, and
        rotary embeddings rotate dimension pairs, so the head dimension must be even."""
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}); "
                "change d_model or n_heads so that every head gets d_model / n_heads dimensions."
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}); "
                "choose n_kv_heads as a divisor of n_heads (n_kv_heads = n_heads for standard attention)."
            )
        if self.head_dim % 2:
            raise ValueError(
                f"model.d_model / n_heads = {self.head_dim} must be even for rotary embeddings; "
                "change d_model or n_heads."
            )

    def with_vocab(self, tokenizer_vocab_size: int) -> LlamaSettings:
        """The model with a missing vocabulary size filled in from the tokenizer, or checked to cover it.

        A missing size is rounded up to a multiple of 64, which keeps the output matmul on
        efficient shapes; the extra rows are never targets.
        """
        if self.vocab_size is None:
            return dataclasses.replace(self, vocab_size=-(-tokenizer_vocab_size // 64) * 64)
        if self.vocab_size < tokenizer_vocab_size:
            raise ConfigError(
                f"model.vocab_size={self.vocab_size} is smaller than the tokenizer's {tokenizer_vocab_size}"
                f" tokens: set model.vocab_size={tokenizer_vocab_size} (or null to take it from the tokenizer)."
            )
        return self

    def check_services(self, run: RunContext) -> None:
        """A vocabulary set in the config covers the tokenizer's (a null one is taken from it)."""
        if self.vocab_size is not None:
            self.with_vocab(run.tokenizer_vocab_size())

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head."""
        return self.d_model // self.n_heads
