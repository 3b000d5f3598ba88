"""Muon on the hidden weight matrices, AdamW on the rest (``optimizer=muon``).

Muon (Jordan et al. 2024) replaces each hidden matrix's momentum update by its nearest
semi-orthogonal matrix, computed with a few Newton-Schulz iterations; Moonlight (Liu et al.
2025, arXiv 2502.16982) trained Llama-style models with it to a given loss on markedly fewer
tokens than AdamW. This file holds Muon's step (``torch.optim.Muon``'s update, with the
Newton-Schulz iteration in a chosen dtype), decides which parameters it gets, and steps it
together with AdamW:

- **Muon**: every ``nn.Linear`` weight inside the transformer blocks (attention q, k, v, o
  and MLP gate, up, down projections);
- **AdamW**: the token embedding and the output head (decayed) and the RMSNorm gains (not
  decayed), as Muon is meant for hidden 2-D matrices only.

``adjust_lr_fn: match_rms_adamw`` (Moonlight's rule) scales Muon's rate for an A x B matrix
by 0.2 sqrt(max(A, B)), which gives its update the RMS of a typical AdamW update: one peak
learning rate, one weight decay and one schedule then drive both groups.

``ns_dtype``: ``torch.optim.Muon`` always iterates in bfloat16, cheap on GPUs and on CPUs
with AVX-512 bf16; on CPUs without it a bfloat16 matrix product is tens of times slower than
a float32 one (docs/results.md, "The default recipe"). ``auto`` (the default) iterates in
bfloat16 on GPUs and in float32 on CPUs, so a CPU run's numbers do not depend on which CPU
it got. In bfloat16 the step equals ``torch.optim.Muon``'s bit for bit (tested).

Sharding: under DDP every rank steps whole matrices on the all-reduced gradient. Under
FSDP2 each rank holds a row shard of every matrix as a DTensor; the Newton-Schulz iteration
(matrix products and a norm over the whole matrix) runs on those DTensors, and DTensor
gathers the shards the products need, so every rank computes the update of the whole
matrix and keeps its own rows (tested: 2 ranks take the same steps as one process). This
costs an all-gather of each matrix's update per step, like a forward pass's weights. FSDP1
flattens parameters into 1-D shards, so Muon cannot see matrices there: refused.
"""

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lightning_modules.llama import TransformerBlock
from lightning_modules.optimizers.parameter_groups import decay_groups, trainable

if TYPE_CHECKING:
    from lightning_modules.optimizers.muon_settings import MuonSettings

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.'s quintic iteration, as torch's


def newton_schulz(update: torch.Tensor, steps: int, dtype: torch.dtype, eps: float = 1e-7) -> torch.Tensor:
    """About the nearest semi-orthogonal matrix to ``update`` (singular values pushed into
    roughly [0.7, 1.2]), iterated on the wide orientation so the Gram matrix is the small one."""
    a, b, c = NS_COEFFICIENTS
    tall = update.size(0) > update.size(1)
    x = update.to(dtype)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def lr_ratio(rule: str, shape: torch.Size) -> float:
    """Muon's rate for an A x B matrix relative to the group's: ``original`` keeps the update's
    RMS near that of an orthogonal matrix; ``match_rms_adamw`` near a typical AdamW update's."""
    rows, cols = shape[:2]
    return 0.2 * math.sqrt(max(rows, cols)) if rule == "match_rms_adamw" else math.sqrt(max(1.0, rows / cols))


class Muon(torch.optim.Optimizer):
    """Muon on 2-D parameters: momentum (Nesterov optional), orthogonalised by Newton-Schulz
    in ``ns_dtype``, decoupled weight decay. Group keys and the ``momentum_buffer`` state are
    ``torch.optim.Muon``'s (plus ``ns_dtype``), so its checkpoints load here."""

    def __init__(
        self,
        params: Any,
        *,
        lr: float,
        weight_decay: float,
        momentum: float,
        nesterov: bool,
        ns_steps: int,
        adjust_lr_fn: str,
        ns_dtype: str,
    ) -> None:
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        """One step on the gradients present (``MuonWithAdamW`` evaluates any closure first)."""
        for group in self.param_groups:
            lr, momentum, dtype = group["lr"], group["momentum"], getattr(torch, group["ns_dtype"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(param.grad)
                buffer = state["momentum_buffer"].lerp_(param.grad, 1 - momentum)
                update = param.grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = newton_schulz(update, group["ns_steps"], dtype)
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-lr * lr_ratio(group["adjust_lr_fn"], param.shape))


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weights of the linear layers inside the transformer blocks."""
    return [
        module.weight
        for block in model.modules()
        if isinstance(block, TransformerBlock)
        for module in block.modules()
        if isinstance(module, nn.Linear) and module.weight.requires_grad
    ]


class MuonWithAdamW(torch.optim.Optimizer):
    """A ``Muon`` and a ``torch.optim.AdamW`` stepped as one optimizer.

    Their parameter groups (Muon's first) and their per-parameter state are this optimizer's
    own, shared by reference, so the training module (which sets every group's learning
    rate), checkpoints (``state_dict``, also through distributed checkpointing) and DiLoCo
    (which swaps ``state`` between simulated replicas) see one optimizer.
    """

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        self._muon_groups = len(muon.param_groups)
        super().__init__([*muon.param_groups, *adamw.param_groups], defaults={})
        self._link()

    @property
    def state(self) -> Any:
        return self.__dict__["_state"]

    @state.setter
    def state(self, value: Any) -> None:
        self.__dict__["_state"] = value
        for inner in ("muon", "adamw"):
            if inner in self.__dict__:
                self.__dict__[inner].state = value

    def _link(self) -> None:
        """Share this optimizer's groups and state with the two it steps."""
        self.muon.param_groups = self.param_groups[: self._muon_groups]
        self.adamw.param_groups = self.param_groups[self._muon_groups :]
        self.state = self.state

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "muon": self.muon, "adamw": self.adamw, "_muon_groups": self._muon_groups}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """``load_state_dict`` ends here with new groups and state: share them again."""
        state = dict(state)
        value = state.pop("state")
        super().__setstate__(state)
        self.state = value
        self._link()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss


def muon_with_adamw(settings: "MuonSettings", model: nn.Module, fused: bool) -> MuonWithAdamW:
    """Muon over the blocks' hidden matrices, AdamW over the rest, as ``settings`` set them."""
    hidden = hidden_matrices(model)
    muon_ids = {id(p) for p in hidden}
    rest = [p for p in trainable(model) if id(p) not in muon_ids]
    # Muon's arguments are named as the settings are.
    same_names = ("lr", "weight_decay", "momentum", "nesterov", "ns_steps", "adjust_lr_fn")
    arguments = {name: getattr(settings, name) for name in same_names}
    muon = Muon([{"params": hidden, "name": "muon"}], **arguments, ns_dtype=settings.iteration_dtype(hidden))
    decayed, gains = decay_groups(rest, model, settings.weight_decay)
    fused = fused and all(p.device.type == "cuda" for p in rest)
    adamw = torch.optim.AdamW(
        [{**decayed, "name": "adamw"}, {**gains, "name": "adamw_no_decay"}],
        lr=settings.lr,
        betas=tuple(settings.betas),
        eps=settings.eps,
        fused=fused or None,
    )
    return MuonWithAdamW(muon, adamw)
