"""Peak resident memory per rank of building a sharded Llama, with and without meta-device init.

Each path runs in fresh CPU processes (gloo): "meta" builds on the meta device, shards
every block and the root with FSDP2 and then materialises shard by shard
(``materialize_and_init``); "plain" builds the whole fp32 model on every rank and then
shards it (``benchmarks/meta_init_memory.py``).

    python scripts/measure_meta_init.py                      # tinyllama_1b, 2 ranks
    python scripts/measure_meta_init.py --preset micro_llama_300m --world-size 4
"""

import argparse

from hydra.utils import instantiate

from benchmarks.meta_init_memory import GB, MODEL_CONF, peak_increase_per_rank
from launch.from_config import config_file
from lightning_modules.llama import count_parameters


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tinyllama_1b", help="a model preset in conf/model")
    parser.add_argument("--world-size", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = instantiate(config_file(MODEL_CONF / f"{args.preset}.yaml"))
    fp32_bytes = 4 * count_parameters(config)
    with_meta = peak_increase_per_rank(config, args.world_size, meta=True)
    without = peak_increase_per_rank(config, args.world_size, meta=False)
    print(f"{args.preset}: {fp32_bytes // 4:,} parameters, fp32 {fp32_bytes / GB:.2f} GB, {args.world_size} ranks")
    print(f"{'rank':>4}  {'meta init GB':>12}  {'% of fp32':>9}  {'plain GB':>8}  {'% of fp32':>9}")
    for rank, (meta_peak, plain_peak) in enumerate(zip(with_meta, without, strict=True)):
        print(
            f"{rank:>4}  {meta_peak / GB:>12.2f}  {100 * meta_peak / fp32_bytes:>8.1f}%"
            f"  {plain_peak / GB:>8.2f}  {100 * plain_peak / fp32_bytes:>8.1f}%"
        )


if __name__ == "__main__":
    main()
