"""Every mistake in settings, data or a checkpoint ends with exit code 2 and one `error:` line.

train.py runs in this process as `python train.py ...` runs it (``runpy`` with the
arguments in ``sys.argv``), so each case costs a fraction of a second; one case is also run
as a real subprocess. Each error names the setting or file and the fix, and a failed run
leaves no folder and no cache behind where it stopped before tokenizing.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.run_helpers import REPO, TINY, run_train, train_in_process


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["batch.global_batch_size=abc"], "error: batch.global_batch_size='abc' must be an integer."),
        (["token_budget=abc"], "error: token_budget='abc' must be an integer or null."),
        (["optimizer.lr=abc"], "error: optimizer.lr='abc' must be a number."),
        (["optimizer.lr=-1"], "error: optimizer.lr=-1.0 must be > 0."),
        (["data.seq_len=4"], "error: data.seq_len must be an integer >= 8, got 4"),
        (["optimiser.lr=1"], "error: optimiser.lr is not a setting; did you mean optimizer.lr?"),
        (
            ["+technique=adaptive_batch", "technique.adaptive_batch.max_batchsize=64"],
            "technique.adaptive_batch.max_batchsize is not a setting; did you mean technique.adaptive_batch.max_global_batch_size?",
        ),
        (
            ["+experiment=nope"],
            "error: In 'train': Could not find 'experiment/nope'; available options in 'experiment': adamw_recipe, adaptive_bs,",
        ),
        (["optimizer=sgd"], "Could not find 'optimizer/sgd'; available options in 'optimizer': adamw, muon (`python"),
        (
            ["init_from_hf=/no/such/folder"],
            "error: init_from_hf=/no/such/folder: /no/such/folder/config.json does not exist",
        ),
        (["trainer.devices=2", "trainer.accelerator=cpu"], "need a distributed strategy: add strategy=ddp"),
        (["batch.micro_batch_size=3"], "batch.micro_batch_size=3 does not divide each rank's share"),
        (["+technique=diloco", "technique.diloco.replicas=0"], "technique.diloco.replicas=0"),
        (
            [
                "+technique=[diloco,adaptive_batch]",
                "batch.global_batch_size=64",
                "technique.adaptive_batch.read_next_step=true",
            ],
            "technique.adaptive_batch.read_next_step=true does not compose with simulated DiLoCo replicas",
        ),
        (["data.tokenizer.vocab_size=4096"], "data.tokenizer.vocab_size=4096 applies to kind=bpe"),
        (
            ["layout.float8=fp8"],
            "error: layout.float8='fp8' is unknown; choose one of ('none', 'tensorwise', 'rowwise').",
        ),
        (
            ["layout.float8=rowwise", "trainer.accelerator=cpu"],
            "layout.float8=rowwise on a CPU run needs float8 emulation: add layout.float8_emulate=true",
        ),
        (["layout.float8=rowwise"], "layout.float8=rowwise needs float8 tensor cores (compute capability 8.9+"),
        (["layout.float8=tensorwise", "strategy=fsdp"], "layout.float8=tensorwise does not compose with strategy=fsdp"),
        (
            ["layout.float8=rowwise", "layout.float8_emulate=true", "model.mlp_hidden=88"],
            "multiples of 16, but model.mlp_hidden=88; choose such a model or set layout.float8=none.",
        ),
        (["layout.float8_emulate=true"], "layout.float8_emulate=true has no effect with layout.float8=none"),
        # Lightning's own counters: each ended in its traceback (or a division by zero) in a run folder.
        (["trainer.max_steps=-5"], "trainer.max_steps=-5 must be at least -1 (-1 stops at the token budget only)."),
        (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0 must be at least 1"),
        (["trainer.num_nodes=0"], "trainer.num_nodes=0 must be at least 1"),
        (["trainer.devices=0"], "trainer.devices=0 is not a device count: give the processes per node"),
        (["trainer.precision=bogus"], "trainer.precision=bogus is not a precision this framework trains with"),
        (["trainer.accelerator=tpu"], "trainer.accelerator=tpu is not supported; choose one of auto, cpu,"),
    ],
)
def test_setting_mistakes_are_one_line_before_any_work(overrides, message, tmp_path):
    code, stderr = train_in_process(TINY + overrides, tmp_path / "run", tmp_path / "cache")
    assert code == 2, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1 and message in lines[0], stderr[-3000:]
    assert "search path" not in lines[0] and "To append" not in lines[0]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def files_source(*paths: Path) -> list[str]:
    return ["data=local_files", f"data.source.paths=[{','.join(str(p) for p in paths)}]"]


def test_data_mistakes_name_the_file_and_the_fix(tmp_path):
    cases = {}
    (tmp_path / "latin.txt").write_bytes("caf\xe9 au lait\n\nmore text".encode("latin-1"))
    cases["latin"] = (files_source(tmp_path / "latin.txt"), "latin.txt: not valid UTF-8 at byte 3 (line 1)")
    lines = [json.dumps({"text": f"document {i} " * 20}) for i in range(30)]
    (tmp_path / "broken.jsonl").write_text("\n".join(lines[:2] + ['{"text": "unterminated'] + lines[2:]) + "\n")
    cases["jsonl"] = (files_source(tmp_path / "broken.jsonl"), "broken.jsonl: line 3 is not valid JSON")
    cases["missing"] = (files_source(tmp_path / "nowhere.txt"), "data.source.paths: ")
    (tmp_path / "small.txt").write_text("a few words\n\nand a few more\n")
    cases["small"] = (files_source(tmp_path / "small.txt") + ["data.val_fraction=0.4"], "split has 0")
    for name, (overrides, message) in cases.items():
        code, stderr = train_in_process(TINY + overrides, tmp_path / name, tmp_path / f"cache_{name}")
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1 and message in lines[0], (name, stderr[-3000:])
        # Found before the default logger (W&B) started: no run folder, no W&B output.
        assert not (tmp_path / name).exists() and "wandb" not in stderr, (name, stderr[-3000:])


def test_a_refused_run_in_the_default_layout_leaves_no_folder_at_all(tmp_path) -> None:
    """From a fresh folder, with the default logger: no outputs/runs/default/<time>, and no
    empty runs/default, runs or outputs either."""
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "batch.global_batch_size=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2 and result.stderr.strip() == "error: batch.global_batch_size=0 must be >= 1.", (
        result.stderr
    )
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """A 2-step TINY run's last checkpoint, and the cache it was trained from."""
    tmp = tmp_path_factory.mktemp("trained")
    code, stderr = train_in_process(TINY + ["trainer.max_steps=2", "logger=none"], tmp / "run", tmp / "cache")
    assert code == 0, stderr[-3000:]
    return tmp / "run" / "checkpoints" / "last.ckpt", tmp / "cache"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ckpt_path={tmp}/missing.ckpt"], "does not exist"),
        (["ckpt_path={tmp}/corrupt.ckpt"], "is not a readable checkpoint"),
        (
            ["ckpt_path={ckpt}", "model.d_model=64"],
            "was trained with model.d_model=32, but this run has model.d_model=64",
        ),
        (["ckpt_path={ckpt}", "data.seq_len=64"], "was trained with data.seq_len=32, but this run has data.seq_len=64"),
        (["ckpt_path={ckpt}", "+technique=diloco", "trainer.max_steps=4"], "technique.diloco.replicas (simulated)=1"),
    ],
)
def test_checkpoint_mistakes_are_refused_naming_the_setting(overrides, message, checkpoint, tmp_path):
    ckpt, cache = checkpoint
    (tmp_path / "corrupt.ckpt").write_bytes(b"not a checkpoint")
    overrides = [o.format(tmp=tmp_path, ckpt=ckpt) for o in overrides]
    code, stderr = train_in_process(TINY + ["trainer.max_steps=3", "logger=none"] + overrides, tmp_path / "run", cache)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1 and message in lines[0], stderr[-3000:]


def test_evaluate_refuses_a_truncated_checkpoint_in_one_line(checkpoint, tmp_path):
    ckpt, _ = checkpoint
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(ckpt.read_bytes()[:4096])
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(truncated), "--tasks", "corpus_cloze"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: {truncated} is not a readable checkpoint (RuntimeError: PytorchStreamReader failed reading zip archive:"
        " failed finding central directory)"
    ]


def test_resume_applies_a_new_learning_rate_and_batch_and_says_so(checkpoint, tmp_path):
    ckpt, cache = checkpoint
    overrides = [
        "trainer.max_steps=3",
        "logger=none",
        f"ckpt_path={ckpt}",
        "optimizer.lr=2e-3",
        "batch.global_batch_size=16",
    ]
    result = run_train(TINY + overrides, tmp_path / "run", cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "resuming with optimizer.lr=0.002 (the checkpoint's run had 0.004)" in output
    assert "resuming with batch.global_batch_size=16 (the checkpoint's run was at 8)" in output
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["training_state"]
    assert state["clock"]["sequences"] == 2 * 8 + 16  # two steps of 8, then one of 16


def test_a_real_process_exits_2_with_one_line(tmp_path):
    result = run_train(TINY + ["optimizer.lr=abc"], tmp_path / "run", tmp_path / "cache")
    assert result.returncode == 2 and result.stderr.strip() == "error: optimizer.lr='abc' must be a number."
