"""Export a training checkpoint of this project as a Hugging Face Llama folder.

    python scripts/export_hf.py CKPT_PATH OUT_DIR [--dtype bfloat16]

CKPT_PATH is a Lightning ``.ckpt`` file or a distributed-checkpoint folder written by
ModelParallelStrategy. OUT_DIR receives ``config.json``, ``generation_config.json``,
``model.safetensors`` and the run's tokenizer (``tokenizer.json`` and its configs, rebuilt
from the data settings the checkpoint holds), so that

    tokenizer = AutoTokenizer.from_pretrained(OUT_DIR)
    model = AutoModelForCausalLM.from_pretrained(OUT_DIR)
    model.generate(**tokenizer(prompt, return_tensors="pt"))

stops at the end-of-document token and never emits the padded vocabulary rows. A
checkpoint without data settings (saved before checkpoints held them) is exported without
a tokenizer, with a warning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from data.tokenizer_export import save_hf_tokenizer
from evaluation.checkpoint import DATA_SETTINGS, checkpoint_model, read_checkpoint
from launch.cli import exit_code
from lightning_modules.hf_interop import DEFAULT_MAX_POSITION_EMBEDDINGS, save_hf_pretrained

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="Lightning .ckpt file or distributed checkpoint folder")
    parser.add_argument("out_dir", type=Path, help="output folder for the model, its configs and tokenizer")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weight dtype to write")
    parser.add_argument(
        "--max-position-embeddings",
        type=int,
        default=None,
        help="context length advertised in config.json (default: the training seq_len, else "
        f"{DEFAULT_MAX_POSITION_EMBEDDINGS}; rotary embeddings themselves have no limit)",
    )
    parser.add_argument(
        "--allow-stale-weights",
        action="store_true",
        help="export a checkpoint whose weights are not its run's final ones (a DiLoCo group that ended behind)",
    )
    return parser.parse_args(argv)


def export(args: argparse.Namespace) -> None:
    contents = read_checkpoint(args.checkpoint, args.allow_stale_weights)
    data_settings = contents.metadata.get(DATA_SETTINGS)
    model = checkpoint_model(contents)
    tokenizer_ids = None
    if data_settings is None:
        print(
            f"warning: {args.checkpoint} holds no data settings ({DATA_SETTINGS}), so no tokenizer is "
            "written; add the tokenizer files to the folder yourself",
            file=sys.stderr,
        )
    else:
        tokenizer_ids = save_hf_tokenizer(data_settings, args.out_dir)
    trained_length = (data_settings or {}).get("seq_len", DEFAULT_MAX_POSITION_EMBEDDINGS)
    max_positions = args.max_position_embeddings or trained_length
    save_hf_pretrained(model.to(DTYPES[args.dtype]), args.out_dir, max_positions, tokenizer_ids)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"Wrote {contents.config.name} ({parameters:,} parameters) to {args.out_dir}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return exit_code(lambda: export(args))


if __name__ == "__main__":
    sys.exit(main())
