"""The norm test's cost: its overhead against the same training without it (compiled, as the
techniques section measures it; and compiled with its statistics read a step later, so no
step waits for them), and where its time goes, from torch.profiler over eager
runs of both (the test's own work runs eagerly between backward passes in either case).

The profile's difference (norm test minus baseline, per step, by operator) is written to
``norm_test_profile.md`` in ``--out``.
"""

import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.runs import RunResult
from benchmarks.gpu.sections.techniques import MAX_TECHNIQUE_OVERHEAD, NEVER_GROWS
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, decimals, percent, rate
from callbacks.batch_size.gradient_samples import squared_norms
from lightning_modules.llama import Llama
from settings.typed import settings_from_config

NORM_COLUMNS = [
    Column("layout", "layout"),
    Column("baseline_tokens_per_sec", "baseline tokens/s", rate),
    Column("tokens_per_sec", "norm test tokens/s", rate),
    Column("overhead", "overhead", percent),
    Column("baseline_device_ms", "baseline device ms/step", decimals),
    Column("device_ms", "norm test device ms/step", decimals),
    Column("result", f"target: overhead <= {MAX_TECHNIQUE_OVERHEAD:.0%}"),
]
TOP_OPERATORS = 15


def profile_overrides(path: Path, skip: int) -> list[str]:
    return [
        "+callbacks.profile._target_=benchmarks.gpu.profiler.ProfileSteps",
        f"+callbacks.profile.path={path}",
        f"+callbacks.profile.skip={skip}",
    ]


def read_profile(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def device_ms_per_step(profile: dict[str, Any] | None) -> float | None:
    """The kernels' time per step (on CPU, where there are none, the operators' host time)."""
    if not profile:
        return None
    ops = profile["ops"].values()
    kernels = [op for op in ops if op["kernel"]] or list(ops)
    return sum(op["self_device_us"] for op in kernels) / profile["steps"] / 1e3


def profile_difference(baseline: dict[str, Any], tested: dict[str, Any]) -> str:
    """Markdown: the operators whose device time per step grew most with the norm test."""

    def per_step(profile: dict[str, Any], name: str, key: str) -> float:
        op = profile["ops"].get(name)
        return op[key] / profile["steps"] / 1e3 if op else 0.0

    names = set(baseline["ops"]) | set(tested["ops"])
    grown = sorted(
        names,
        key=lambda n: per_step(tested, n, "self_device_us") - per_step(baseline, n, "self_device_us"),
        reverse=True,
    )[:TOP_OPERATORS]
    lines = [
        "| operator | device ms/step, norm test | baseline | difference | host ms/step, norm test | baseline |",
        "|---|---|---|---|---|---|",
    ]
    for name in grown:
        device = per_step(tested, name, "self_device_us"), per_step(baseline, name, "self_device_us")
        host = per_step(tested, name, "self_host_us"), per_step(baseline, name, "self_host_us")
        lines.append(
            f"| `{name}` | {device[0]:.3f} | {device[1]:.3f} | {device[0] - device[1]:+.3f} | {host[0]:.3f} | {host[1]:.3f} |"
        )
    return "\n".join(lines)


def norm_row(
    layout: str, baseline: RunResult, tested: RunResult, profiles: tuple[dict | None, dict | None]
) -> dict[str, Any]:
    row = {
        "layout": layout,
        "baseline_tokens_per_sec": baseline.tokens_per_sec,
        "tokens_per_sec": tested.tokens_per_sec,
        "baseline_device_ms": device_ms_per_step(profiles[0]),
        "device_ms": device_ms_per_step(profiles[1]),
    }
    if baseline.tokens_per_sec is None or tested.tokens_per_sec is None:
        return {**row, "result": tested.status if not tested.ok else baseline.status}
    overhead = 1 - tested.tokens_per_sec / baseline.tokens_per_sec
    return {**row, "overhead": overhead, "result": "within" if overhead <= MAX_TECHNIQUE_OVERHEAD else "OVER"}


def squared_norm_error(model_name: str, device: str) -> float:
    """Relative error of the norm test's squared norms on the device, over random gradients of
    the model's parameter shapes, against float64."""
    from benchmarks.loops import REPO
    from launch.from_config import config_file
    from lightning_modules.llama_settings import LlamaSettings

    node = config_file(REPO / "conf" / "model" / f"{model_name}.yaml")
    config = settings_from_config(LlamaSettings, {**node, "vocab_size": 32000}, "model")
    with torch.device("meta"):
        shapes = [p.shape for p in Llama(config).parameters()]
    generator = torch.Generator(device).manual_seed(0)
    grads = [torch.randn(shape, device=device, generator=generator) * 1e-3 for shape in shapes]
    exact = sum(g.double().square().sum() for g in grads)
    return (abs(squared_norms(grads, torch.device(device)) - exact) / exact).item()


def norm_test(suite: Suite) -> Table:
    plan, args = suite.plan, suite.args
    batch, micro = plan.global_batch, plan.work_micro_batch
    out = Path(args.out)
    rows, written = [], []
    # compiled, reading the statistics at the tested step's end and a step later; eager, profiled
    variants = ((plan.work_compile, False, False), (plan.work_compile, False, True), ("none", True, False))
    for compile_mode, profiled, read_next_step in variants:
        work = suite.work_layout(plan.model, micro_batch=micro, compile_mode=compile_mode)
        constant = [*work, "+experiment=constant_bs", f"batch.global_batch_size={batch}"]
        tested = [*work, "+experiment=adaptive_bs", f"batch.global_batch_size={batch}", *NEVER_GROWS]
        if read_next_step:
            tested.append("technique.adaptive_batch.read_next_step=true")
        later = ", read a step later" if read_next_step else ""
        paths = (out / "norm_test_profile_baseline.json", out / "norm_test_profile_tested.json")
        runs = []
        for label, overrides, path in (("baseline", constant, paths[0]), ("norm test", tested, paths[1])):
            path.unlink(missing_ok=True)
            extra = profile_overrides(path, args.warmup) if profiled else []
            runs.append(
                suite.run(
                    f"norm test: {label}, compile {compile_mode}{', profiled' if profiled else ''}{later}",
                    [*overrides, *extra],
                    args.steps,
                    args.warmup,
                )
            )
        profiles = (read_profile(paths[0]), read_profile(paths[1])) if profiled else (None, None)
        layout = f"micro {micro} of {batch}, compile {compile_mode}" + (", profiled" if profiled else "") + later
        rows.append(norm_row(layout, runs[0], runs[1], profiles))
        if all(profiles):
            written.append(profile_difference(*profiles))
    error = squared_norm_error(plan.model, plan.device)
    rows.append(
        {
            "layout": f"squared norms of {plan.model}-shaped gradients against float64 ({plan.device})",
            "result": f"relative error {error:.1e}",
        }
    )
    if written:
        (out / "norm_test_profile.md").write_text(
            "# Norm test: where its time goes (eager, profiled)\n\n" + written[0] + "\n"
        )
    return Table("norm_test", NORM_COLUMNS, rows)
