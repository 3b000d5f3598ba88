"""The GPU benchmark in one call: layouts, correctness, technique overhead, framework overhead.

``scripts/benchmark_gpu.py`` runs this package (``cli.main``). Within about nine minutes on one H100 it
measures, in one process and through the framework's own pieces (``benchmarks/loops.py``):

1. **layouts**: TinyLlama-1.1B at 2048 tokens, micro-batch x activation checkpointing x
   compile with the fused kernels on; micro_llama_300m and diloco_35m at the better of two
   layouts each;
2. **kernels**: TinyLlama at one layout with each choice of fused kernels (Liger's or
   Inductor's norm/SwiGLU/RoPE, Liger's or the chunked cross-entropy, the SDPA backend);
3. **mfu**: TinyLlama with the best kernels at the layouts the first two leave out: one
   micro-batch per step, bf16 parameters through FSDP2 (one cast per step), the whole model
   compiled;
4. **correctness**: per-step losses over 20 steps of bf16 against fp32, of FSDP1 and FSDP2
   on one device against one device, and of each fused path against the plain one, beside
   the spread of two identical runs (the GPU's reductions are not deterministic);
5. **techniques**: the norm test, sequence-length warmup (with Dynamo's count of graphs
   compiled after the first length) and simulated DiLoCo, each against the same training
   without it, under bf16 + compile;
6. **overhead**: the framework against a plain PyTorch loop with the same model and kernels.

Before each run Dynamo and the CUDA allocator are reset, so every run compiles and
allocates as a fresh process would (Inductor's on-disk cache stays: a graph compiled
before compiles faster, which only shortens untimed warm-up steps). A run that runs out
of memory, or fails, says so in its row and the suite goes on. The time budget is split
among the sections by their expected shares; a run whose expected time would pass its
section's deadline is reported as skipped, so one call never overruns. The report (a
markdown table per section and a JSON file with every number) is rewritten after each
section. ``docs/gpu_benchmark.md`` gives the plan, its time estimate and the command for a
bare GPU machine.

Where things live: ``plan.py`` (what a call runs), ``runs.py`` (one timed run),
``suite.py`` (the call's runs and time budget), ``tables.py`` and ``report.py`` (the
output), ``graph_count.py`` (Dynamo's graph count), ``sections/`` (one module per
section), ``cli.py`` (the command line).
"""
