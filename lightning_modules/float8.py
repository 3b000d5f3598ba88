"""Float8 training of the transformer blocks' linear layers, through torchao.

torchao's ``Float8Linear`` casts a linear layer's input, weight and output gradient to
float8 with dynamic scales and multiplies them with ``torch._scaled_mm`` (the H100's
float8 tensor cores), keeping the weights, gradients and optimizer in their usual dtype.
Two recipes are offered, as torchao names them:

- ``tensorwise``: one scale per tensor; the fastest. Under FSDP2 the weights are also
  all-gathered in float8 (half the bytes of bf16), with the scales of all weights computed
  in one pass after each optimizer step (``precompute_fsdp_scales``).
- ``rowwise``: one scale per row (per column for the weight), e4m3 everywhere; more
  accurate where rows differ in range, somewhat slower. Its weights are gathered in the
  compute dtype (torchao's float8 all-gather supports the tensorwise recipe only).

Only the blocks' projections are converted (``layers.*``): the embedding is a lookup, and
the output head feeds the loss, whose precision float8 would cost most (torchtitan and
torchao leave it out too). Conversion runs on the meta-device model before checkpointing,
compile and sharding, so compile fuses the casts into each block's graph.

FLOPs are counted as in bf16 (the same matmuls): MFU stays against the device's bf16 peak;
the throughput callback also gives the share of the float8 peak (``flops.py``).

``emulate`` runs the float8 casts and a float32 matmul of the float8 values (torchao's
emulation), on any device: the CPU tests check the wiring and numerics this way. It is not
faster than bf16 anywhere.
"""

import dataclasses
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

FLOAT8_MIN_CAPABILITY = (8, 9)  # Ada (L4, L40S) and Hopper (H100, H200) have float8 tensor cores
BLOCKS_PREFIX = "layers."


def torchao_available() -> bool:
    """Whether torchao's float8 training imports. Its import warns about its CUDA extensions
    where they cannot load (a CPU machine, another torch) and torch about one of its enums:
    nothing float8 training uses, so those lines are kept off the console."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torchao.kernel.intmm", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return False
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    return True


def float8_linear_config(recipe: str, emulate: bool, sharded: bool):
    """torchao's config for ``recipe``; float8 all-gather under FSDP2 for the tensorwise recipe."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(
        config, emulate=emulate, enable_fsdp_float8_all_gather=float8_all_gather(recipe, sharded)
    )


def is_block_linear(module: nn.Module, name: str) -> bool:
    """The linear layers float8 converts: those inside the transformer blocks."""
    return isinstance(module, nn.Linear) and name.startswith(BLOCKS_PREFIX)


def convert_to_float8(model: nn.Module, recipe: str, emulate: bool, sharded: bool) -> list[str]:
    """Swap the blocks' ``nn.Linear`` layers for torchao's ``Float8Linear`` in place; return their names.

    Works on a meta-device model. Parameter names and shapes are unchanged, so checkpoints
    of a float8 run load into a bf16 run and back.
    """
    from torchao.float8 import convert_to_float8_training

    converted = [name for name, module in model.named_modules() if is_block_linear(module, name)]
    convert_to_float8_training(
        model, config=float8_linear_config(recipe, emulate, sharded), module_filter_fn=is_block_linear
    )
    return converted


def float8_all_gather(recipe: str, sharded: bool) -> bool:
    """Whether FSDP2 gathers this run's weights in float8 (then their scales are precomputed per step)."""
    return sharded and recipe == "tensorwise"


def precompute_fsdp_scales(model: nn.Module) -> None:
    """Compute every float8-gathered weight's scale in one pass (one all-reduce of the amaxes)
    after the optimizer step, instead of one per weight at each all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def float8_device_problem() -> str | None:
    """Why this machine cannot run float8 matmuls (None: it can)."""
    if not torch.cuda.is_available():
        return "this machine has no CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability < FLOAT8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return f"{name} (compute capability {capability[0]}.{capability[1]}) has no float8 tensor cores"
    return None
