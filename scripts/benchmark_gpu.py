"""The GPU benchmark in one call: layouts, correctness, technique overhead and framework overhead
on one H100 or H200 within about nine minutes; a markdown table and a JSON file in --out.

    python scripts/benchmark_gpu.py                                     # everything, on one GPU
    python scripts/benchmark_gpu.py --sections techniques,overhead      # some sections
    python scripts/benchmark_gpu.py --quick --budget-seconds 1200       # CPU smoke mode

The logic lives in ``benchmarks/gpu/``; docs/gpu_benchmark.md has the plan, the time
estimate and the command for a bare GPU machine (wheels from scripts/fetch_gpu_wheels.sh).
"""

from benchmarks.gpu.cli import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    main()
