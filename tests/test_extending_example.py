"""The worked example of docs/extending.md ("A setting and its check"): `layout.checkpoint_every`
wraps every n-th block, recomputes the same gradients, is counted so in the memory plan,
and its mistakes are the documented lines."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.memory_plan import memory_plan
from lightning_modules.parallelism import apply_layout
from tests.run_helpers import REPO, default_settings, train_in_process

CONFIG = LlamaSettings(vocab_size=64, n_layers=5, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)
DOCUMENT = REPO / "docs" / "extending.md"


def documented_mistakes() -> list[tuple[str, str]]:
    """(command, error line) pairs of the example's text block."""
    section = DOCUMENT.read_text().split("## A setting and its check", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1).splitlines()
    return [(block[i].removeprefix("$ "), block[i + 1]) for i in range(0, len(block), 2)]


@pytest.mark.parametrize("mode", ["full", "mlp"])
def test_every_nth_block_is_checkpointed_and_the_gradients_are_the_plain_ones(mode):
    torch.manual_seed(0)
    reference = Llama(CONFIG)
    laid_out = copy.deepcopy(reference)
    apply_layout(
        laid_out, default_settings(LayoutSettings, "layout", activation_checkpointing=mode, checkpoint_every=2)
    )
    wrapped = [
        i
        for i, block in enumerate(laid_out.layers.values())
        if isinstance(block if mode == "full" else block.mlp, CheckpointWrapper)
    ]
    assert wrapped == [0, 2, 4]
    tokens = torch.randint(0, 64, (2, 17))
    for model in (reference, laid_out):
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for plain, checkpointed in zip(reference.parameters(), laid_out.parameters(), strict=True):
        torch.testing.assert_close(checkpointed.grad, plain.grad, rtol=0, atol=0)


@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_the_memory_plan_counts_the_blocks_in_between_in_full(every):
    """Block by block, in bytes: a checkpointed block keeps its fp32 input, the others everything."""
    d, h = CONFIG.d_model, CONFIG.mlp_hidden
    k = d  # fp32 attention repeats the key-value heads to the query heads' width
    whole = 2 * (4 + 4) * d + 2 * 4 * d + 4 * (2 * d + 2 * k) + 4 * 4 * h  # norms, matmul inputs, attention, MLP
    kept = sum(float(4 * d if index % every == 0 else whole) for index in range(CONFIG.n_layers))
    expected = 8 * 16 * (kept + whole + 4 * d)  # one recomputed block, the chunked loss
    plan = memory_plan(
        CONFIG,
        precision="32-true",
        optimizer="adamw",
        shards=1,
        micro_batch=8,
        seq_len=16,
        checkpointing="full",
        loss="chunked",
        checkpoint_every=every,
    )
    assert plan.activations == expected


def test_the_documented_mistakes_are_the_documented_lines(tmp_path):
    mistakes = documented_mistakes()
    assert len(mistakes) == 2
    for number, (command, line) in enumerate(mistakes):
        code, stderr = train_in_process(command.split()[2:], tmp_path / f"run{number}", tmp_path / "cache")
        assert code == 2 and stderr.strip().splitlines()[-1] == line
