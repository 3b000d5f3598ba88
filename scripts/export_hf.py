"""Export a training checkpoint of this project as a Hugging Face Llama folder.

    python scripts/export_hf.py CKPT_PATH OUT_DIR [--dtype bfloat16]

CKPT_PATH is a Lightning ``.ckpt`` file or a distributed-checkpoint folder written by
ModelParallelStrategy. OUT_DIR receives ``config.json`` and ``model.safetensors``, loadable
with ``transformers.LlamaForCausalLM.from_pretrained(OUT_DIR)`` (add a tokenizer yourself).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from lightning_modules.hf_interop import (  # noqa: E402
    DEFAULT_MAX_POSITION_EMBEDDINGS,
    load_lightning_checkpoint,
    save_hf_pretrained,
)
from lightning_modules.llama import Llama  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="Lightning .ckpt file or distributed checkpoint folder")
    parser.add_argument("out_dir", type=Path, help="output folder for config.json and model.safetensors")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weight dtype to write")
    parser.add_argument(
        "--max-position-embeddings",
        type=int,
        default=DEFAULT_MAX_POSITION_EMBEDDINGS,
        help="context length advertised in config.json (rotary embeddings themselves have no limit)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config, state_dict = load_lightning_checkpoint(args.checkpoint)
    except (FileNotFoundError, KeyError, ValueError) as error:
        sys.exit(f"export_hf: {error.args[0] if error.args else error}")
    with torch.device("meta"):
        model = Llama(config)
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.tie_weights()
    save_hf_pretrained(model.to(DTYPES[args.dtype]), args.out_dir, args.max_position_embeddings)
    print(f"Wrote {config.name} ({sum(p.numel() for p in model.parameters()):,} parameters) to {args.out_dir}")


if __name__ == "__main__":
    main()
