"""Build a run's token cache without training: the step a CPU node does before GPU jobs start.

    python scripts/prepare_data.py data=hub data.source.max_tokens=1e10 paths.cache_dir=/shared/cache
    python scripts/prepare_data.py data=mixture

Takes train.py's data overrides (any others are accepted and ignored), tokenizes every text
source into `paths.cache_dir` as train.py would (sharded; an interrupted build continues
when run again on the same host), checks token files, and prints the cache folders. Training
jobs given the same data settings and `paths.cache_dir` then open the cache and tokenize
nothing.
"""

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from common.errors import ConfigError
from launch.builders import instantiate_checked
from launch.cli import COMPOSITION_ERRORS, composition_message, exit_code
from launch.from_config import plain

REPO = Path(__file__).resolve().parents[1]


def prepare(overrides: list[str]) -> None:
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=["logger=none", *overrides])
    except Exception as error:
        if type(error).__name__ not in COMPOSITION_ERRORS:
            raise
        raise ConfigError(composition_message(error, overrides)) from None
    data = instantiate_checked(plain(cfg.data), "data", micro_batch_size=1, _convert_="all")
    data.prepare_data()
    print(f"ready: {Path(cfg.paths.cache_dir).resolve()} (token cache {data.fingerprint})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (data.*, paths.cache_dir)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return exit_code(lambda: prepare(parse_args(argv).overrides))


if __name__ == "__main__":
    sys.exit(main())
