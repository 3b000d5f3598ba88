"""Output projection + cross-entropy fused by chunks of rows: the [N, V] logits never exist whole.

``F.cross_entropy(model(x).float().flatten(0, 1), labels)`` keeps the fp32 logits (and
log-softmax) of every token for backward: for TinyLlama at 8 x 2048 tokens and a 32000-word
vocabulary that is 2 GB, plus as much again for their gradient. Here the N rows are taken
``chunk_size`` at a time: each chunk's logits are computed in the matmul's dtype (bf16 under
mixed precision), upcast to fp32 for a stable log-sum-exp, turned into the chunk's loss and,
right away, into the gradients of the chunk's hidden states and of the weight (as Liger and
others do: since the loss is the graph's last op, its gradient is known up to the incoming
scalar, and computing it now saves recomputing the logits in backward). Only those two
gradients are kept for backward, which multiplies them by the incoming gradient. Extra peak
memory is O(chunk_size x V) instead of O(N x V); what autograd keeps is N x d + V x d.

On CUDA, ``liger_kernels.py`` can put Liger's Triton version of the same fusion in its place.
"""

import torch
from torch import Tensor

IGNORE_INDEX = -100  # labels with this value are not predicted (F.cross_entropy's default)
# Rows per chunk. Each chunk holds a few [chunk, V] buffers (logits in the matmul dtype, fp32
# logits / softmax, their low-precision copy for the gradient matmuls): about 12 bytes x
# chunk x V in bf16, 400 MB for 1024 rows of a 32000-word vocabulary, a fifth of the naive
# path's fp32 logits alone at 16k tokens, while each matmul stays large enough to run the
# GPU at full speed.
DEFAULT_CHUNK_SIZE = 1024


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels`` over labelled tokens.

    Equals ``F.cross_entropy((hidden @ weight.T).float(), labels)`` (``ignore_index=-100``;
    NaN when no token is labelled, with zero gradients, as there) without materialising the
    logits. ``hidden``: [N, d] (flatten batch and time first); ``weight``: [V, d], the
    output projection (it may be the tied embedding: its gradient accumulates through
    autograd as usual); ``labels``: [N] int64. Returns an fp32 scalar (float64 for float64
    inputs). Matmuls run in the inputs' dtype, or autocast's; the weight gradient is
    accumulated over chunks in fp32. Outside grad mode no gradient is computed.
    """
    _check_shapes(hidden, weight, labels, chunk_size)
    if not torch.is_grad_enabled():
        return _chunked_loss_and_grads(hidden, weight, labels, chunk_size, False, False)[0]
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_size)


def _check_shapes(hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int) -> None:
    """Fail with the shapes named, rather than with a matmul error deep in a chunk."""
    if hidden.ndim != 2 or weight.ndim != 2 or labels.ndim != 1:
        raise ValueError(
            f"linear_cross_entropy expects hidden [N, d], weight [V, d] and labels [N]; got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(labels.shape)} (flatten batch and time first)."
        )
    if hidden.shape[1] != weight.shape[1] or hidden.shape[0] != labels.shape[0]:
        raise ValueError(
            f"linear_cross_entropy: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and labels "
            f"{tuple(labels.shape)} disagree: hidden and weight must share d, hidden and labels N."
        )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"linear_cross_entropy: chunk_size must be a positive integer, got {chunk_size!r}.")


def _chunked_loss_and_grads(
    hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int, grad_hidden: bool, grad_weight: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The mean loss and the requested gradients of it (for an incoming gradient of 1).

    The gradient of the mean loss with respect to row i's logits is
    (softmax(logits_i) - onehot(label_i)) / (number of labelled rows), zero for ignored
    rows; it is built in place in the chunk's upcast logits, then rounded to the matmul
    dtype for the two gradient matmuls, as autograd would round it in the plain path.
    Log-sum-exp, loss and weight-gradient sums stay in fp32 (float64 for float64 inputs).
    """
    precise = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or float64 for float64 inputs
    labelled = labels != IGNORE_INDEX
    count = labelled.sum()
    row_scale = labelled.to(precise) / count.clamp(min=1)  # 1/count for labelled rows, 0 for ignored ones
    total = torch.zeros((), dtype=precise, device=hidden.device)
    d_hidden = torch.empty_like(hidden) if grad_hidden else None
    d_weight = torch.zeros(weight.shape, dtype=precise, device=weight.device) if grad_weight else None
    for start in range(0, hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        h, targets = hidden[rows], torch.where(labelled[rows], labels[rows], 0)[:, None]
        logits = h @ weight.T
        matmul_dtype = logits.dtype
        logits = logits.to(precise)
        log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
        token_losses = (log_normalizer - logits.gather(1, targets)).squeeze(1)
        total += (token_losses * labelled[rows]).sum()
        if not (grad_hidden or grad_weight):
            continue
        d_logits = logits.sub_(log_normalizer).exp_()
        d_logits.scatter_add_(1, targets, torch.full_like(token_losses[:, None], -1.0))
        d_logits = d_logits.mul_(row_scale[rows, None]).to(matmul_dtype)
        if d_hidden is not None:
            d_hidden[rows] = d_logits @ weight
        if d_weight is not None:
            d_weight += d_logits.T @ h
    loss = total / count
    return loss, d_hidden, None if d_weight is None else d_weight.to(weight.dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    """Gradients computed in forward; backward only scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int) -> Tensor:
        loss, d_hidden, d_weight = _chunked_loss_and_grads(
            hidden, weight, labels, chunk_size, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        )
        ctx.save_for_backward(d_hidden, d_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        """Out of place, so that a second backward through a retained graph stays right."""
        d_hidden, d_weight = ctx.saved_tensors
        return (
            None if d_hidden is None else d_hidden * grad_output,
            None if d_weight is None else d_weight * grad_output,
            None,
            None,
        )
