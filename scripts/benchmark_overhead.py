"""Framework overhead: the same model, data and batch through train.py's pieces and through
a minimal plain-PyTorch loop, alternated in one process; prints the tokens/s ratio.

    python scripts/benchmark_overhead.py                       # tiny model on CPU
    python scripts/benchmark_overhead.py --steps 30 -- trainer=gpu model=tinyllama_1b data.seq_len=2048

Both sides run the same LlamaConfig with the same initial weights, the same micro-batches
from the data module, AdamW with the same parameter groups, the same gradient
accumulation and clipping. The framework side is a Lightning Trainer with the default
callbacks (validation schedule, throughput, progress bar) but no checkpoint writes, no
optimizer statistics (extra work the plain loop does not do; about 0.6% of a step on the
tiny model) and no logger; its rate is the Throughput callback's. The plain side times the same steps with
time.perf_counter. Both leave out the first ``--warmup`` steps.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launch.builders import build_callbacks, build_datamodule, build_module, build_trainer  # noqa: E402
from launch.config_checks import check_config, check_vocab  # noqa: E402
from lightning_modules.llama import Llama  # noqa: E402
from lightning_modules.lr_schedule import learning_rate  # noqa: E402
from lightning_modules.optim import build_optimizer  # noqa: E402


def load_config(overrides: list[str], steps: int, warmup: int):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                "logger=none",
                "paths.run_dir=/tmp/benchmark_overhead",
                "~callbacks.model_checkpoint",
                "~callbacks.last_checkpoint",
                "~callbacks.optimizer_stats",
                "trainer.enable_checkpointing=false",
                "trainer.num_sanity_val_steps=0",
                f"trainer.max_steps={warmup + steps}",
                "callbacks.validation_schedule.every_n_steps=1000000",
                f"callbacks.throughput.warmup_steps={warmup}",
                f"callbacks.throughput.window={steps}",
                *overrides,
            ],
        )


def now(device: torch.device) -> float:
    """Wall time once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def framework_tokens_per_sec(cfg) -> float:
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(cfg)
    module = build_module(cfg, check_config(cfg), datamodule.vocab_size)
    trainer = build_trainer(cfg, loggers=[], callbacks=build_callbacks(cfg))
    trainer.fit(module, datamodule=datamodule)
    return float(trainer.progress_bar_metrics["perf/tokens_per_sec"])


def plain_tokens_per_sec(cfg, steps: int, warmup: int) -> float:
    """The loop a researcher would write by hand around the same model and data."""
    settings = check_config(cfg)
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    config = check_vocab(settings.model, datamodule.vocab_size)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.trainer.accelerator != "cpu" else "cpu")
    model = Llama(config).to(device)
    optimizer = build_optimizer(model, settings.optimizer)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled="bf16" in str(cfg.trainer.precision))
    accumulation = settings.batch.global_batch_size // settings.batch.micro_batch_size
    batches, tokens, timed_from = iter(datamodule.train_dataloader()), 0, (0, 0.0)
    for step in range(warmup + steps):
        if step == warmup:
            timed_from = (tokens, now(device))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(settings.optimizer.lr, settings.lr_schedule, step + 1, tokens, cfg.token_budget)
        for _ in range(accumulation):
            batch = {key: value.to(device) for key, value in next(batches).items()}
            with autocast:
                logits = model(batch["input_ids"])
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())
            (loss / accumulation).backward()
            tokens += batch["labels"].numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.optimizer.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the framework reads the loss every step too
    return (tokens - timed_from[0]) / (now(device) - timed_from[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternated")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    args = parser.parse_args()
    cfg = load_config(args.overrides, args.steps, args.warmup)

    framework, plain = [], []
    for repeat in range(args.repeats):
        framework.append(framework_tokens_per_sec(cfg))
        plain.append(plain_tokens_per_sec(cfg, args.steps, args.warmup))
        print(f"repeat {repeat + 1}: framework {framework[-1]:,.0f} tokens/s, plain {plain[-1]:,.0f} tokens/s",
              file=sys.stderr)  # fmt: skip
    median_framework, median_plain = statistics.median(framework), statistics.median(plain)
    print("\n| loop | tokens/s (median) | runs |\n|---|---|---|")
    print(f"| plain PyTorch | {median_plain:,.0f} | {', '.join(f'{x:,.0f}' for x in plain)} |")
    print(f"| framework (train.py) | {median_framework:,.0f} | {', '.join(f'{x:,.0f}' for x in framework)} |")
    print(f"\nframework / plain = {median_framework / median_plain:.3f}")


if __name__ == "__main__":
    main()
