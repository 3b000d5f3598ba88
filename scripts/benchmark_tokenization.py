"""Token cache builds against the raw `tokenizers` library, and the builds' peak memory.

    python scripts/benchmark_tokenization.py                         # 100 MB and 1 GB, about 15 min on 2 cores
    python scripts/benchmark_tokenization.py --sizes-mb 20 200       # smaller, for a quick look

A synthetic corpus (paragraphs of the embedded books drawn with a fixed seed) is written as
`.txt`, `.jsonl` and `.parquet` at the first size, and as `.txt` at each size. A 1,024-token
byte-level BPE trained on the books encodes it. Each measurement runs in its own process
and reports its peak RSS:

- baseline: `tokenizers.Tokenizer.encode_batch` over the same documents, already in memory
  (reading them is not timed), 1,000 at a time;
- build: the data module's `prepare_data()`, as a run calls it: reading and parsing the
  files, tokenizing, writing the sharded cache.

Prints tokens per second of both and their ratio per format, then the build's peak RSS per
corpus size. Files go under `outputs/benchmark_tokenization/` (reused when present).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("txt", "jsonl", "parquet")
VOCAB = 1024


def corpus(out: Path, size_mb: int, fmt: str) -> Path:
    """`size_mb` MB of seeded paragraph draws in one format (written once, then reused)."""
    path = out / f"corpus_{size_mb}mb.{fmt}"
    if path.is_file():
        return path
    from data.sources import embedded_corpus_path

    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", embedded_corpus_path().read_text()) if p.strip()]
    rng, written, documents = random.Random(size_mb), 0, []
    while written < size_mb * 1_000_000:
        document = rng.choice(paragraphs)
        documents.append(document)
        written += len(document.encode()) + 2
    partial = path.with_name(path.name + ".partial")
    if fmt == "txt":
        partial.write_text("\n\n".join(documents) + "\n")
    elif fmt == "jsonl":
        with open(partial, "w") as handle:
            handle.writelines(json.dumps({"text": d}) + "\n" for d in documents)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": documents}), partial, row_group_size=10_000)
    partial.replace(path)
    return path


def tokenizer_file(out: Path) -> Path:
    """The benchmark's BPE, trained once on the embedded books."""
    path = out / f"bpe{VOCAB}.json"
    if not path.is_file():
        from data.bpe import train_bpe
        from data.sources import embedded_corpus_path

        text = embedded_corpus_path().read_text()
        train_bpe(iter(p for p in re.split(r"\n\s*\n", text) if p.strip()), VOCAB).save(str(path))
    return path


def measure(kind: str, path: Path, tokenizer: Path, cache: Path) -> dict:
    """One measurement in a fresh process: {"tokens", "seconds", "peak_rss_mb"}."""
    child = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(path), str(tokenizer), str(cache)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if child.returncode != 0:
        raise SystemExit(f"{kind} on {path.name} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def peak_rss_mb() -> float:
    """This process's peak RSS since it started: VmHWM, which belongs to the process's own memory
    map. (`ru_maxrss` is not used: Linux carries it over from the parent across exec, so a
    child of a large parent would report the parent's peak.)"""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def child(kind: str, path: Path, tokenizer_path: Path, cache: Path) -> None:
    import shutil

    if kind == "baseline":
        from tokenizers import Tokenizer

        from data.sources import build_source

        documents = [d for batch in build_source(_source(path)).batches(cache / "hf") for d in batch]
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        start, tokens = time.perf_counter(), 0
        for i in range(0, len(documents), 1000):
            tokens += sum(len(e.ids) + 1 for e in tokenizer.encode_batch(documents[i : i + 1000]))
        seconds = time.perf_counter() - start
    else:
        from data.datamodule import TextDataModule

        shutil.rmtree(cache, ignore_errors=True)
        data = TextDataModule(
            source=_source(path),
            tokenizer={"kind": "file", "path": str(tokenizer_path)},
            seq_len=256,
            micro_batch_size=1,
            val_fraction=0.005,
            val_max_rows=None,
            shuffle=True,
            seed=0,
            cache_dir=str(cache),
        )
        _ = data.tokenizer  # loaded before the clock starts, as in the baseline
        start = time.perf_counter()
        data.prepare_data()
        seconds = time.perf_counter() - start
        meta = json.loads(next(cache.glob("*/meta.json")).read_text())
        tokens = meta["train_tokens"] + meta["val_tokens"]
        shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps({"tokens": tokens, "seconds": seconds, "peak_rss_mb": peak_rss_mb()}))


def _source(path: Path) -> dict:
    return {"kind": "files", "paths": [str(path)]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes-mb", type=int, nargs="+", default=[100, 1000], help="corpus sizes (MB); formats at the first"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        kind, path, tokenizer, cache = args.child
        return child(kind, Path(path), Path(tokenizer), Path(cache))
    out = REPO / "outputs" / "benchmark_tokenization"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_file(out)
    print(
        f"| format ({args.sizes_mb[0]} MB) | tokens | tokenizers batch-encode (tokens/s) | our build (tokens/s) | ratio |"
    )
    print("|---|---|---|---|---|")
    for fmt in FORMATS:
        path = corpus(out, args.sizes_mb[0], fmt)
        base = measure("baseline", path, tokenizer, out / "cache")
        ours = measure("build", path, tokenizer, out / "cache")
        assert ours["tokens"] == base["tokens"], (ours, base)
        rate_base, rate_ours = base["tokens"] / base["seconds"], ours["tokens"] / ours["seconds"]
        print(
            f"| .{fmt} | {ours['tokens']:,} | {rate_base:,.0f} | {rate_ours:,.0f} | {rate_ours / rate_base:.2f} |",
            flush=True,
        )
    print("\n| corpus (.txt) | tokens | build seconds | build peak RSS (MB) | RSS / first size's |")
    print("|---|---|---|---|---|")
    first = None
    for size in args.sizes_mb:
        build = measure("build", corpus(out, size, "txt"), tokenizer, out / "cache")
        first = first or build["peak_rss_mb"]
        print(
            f"| {size:,} MB | {build['tokens']:,} | {build['seconds']:.1f} | {build['peak_rss_mb']:,.0f} | "
            f"{build['peak_rss_mb'] / first:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
