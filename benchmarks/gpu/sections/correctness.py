"""Correctness: per-step losses of each GPU path against its reference, beside the spread of identical runs."""

from dataclasses import dataclass
from typing import Any

from benchmarks.gpu.runs import RunResult
from benchmarks.gpu.suite import Suite
from benchmarks.gpu.tables import Column, Table, loss_columns, scientific
from lightning_modules.liger_kernels import liger_available

CORRECTNESS_COLUMNS = loss_columns(
    Column("max_rel_diff", "max rel diff", scientific), Column("tolerance", "tolerance (abs)", scientific)
)


def loss_differences(reference: RunResult, other: RunResult) -> dict[str, Any]:
    """Largest absolute and relative difference of the per-step losses of two runs."""
    steps = sorted(set(reference.losses) & set(other.losses))
    if not steps:
        return {"steps": 0, "max_abs_diff": None, "max_rel_diff": None}
    differences = [abs(other.losses[step] - reference.losses[step]) for step in steps]
    relative = [difference / abs(reference.losses[step]) for step, difference in zip(steps, differences)]
    return {"steps": len(steps), "max_abs_diff": max(differences), "max_rel_diff": max(relative)}


@dataclass(frozen=True)
class Check:
    """Two runs whose per-step losses are compared: ``compared`` against ``reference`` (the
    same overrides again when ``repeat``: the spread of identical runs); ``unavailable`` says
    why it cannot run here."""

    name: str
    reference: list[str]
    compared: list[str]
    unavailable: str | None = None
    repeat: bool = False


def correctness_checks(suite: Suite) -> list[Check]:
    plan = suite.plan
    batch = plan.correctness_batch
    base = suite.overrides(
        plan.correctness_model,
        f"batch.global_batch_size={batch}",
        f"batch.micro_batch_size={batch}",
        "layout.loss=plain",
        "layout.liger_kernels=false",
        "layout.compile=none",
        "layout.activation_checkpointing=none",
        "layout.fused_adamw=true",
        f"optimizer.lr={plan.correctness_lr}",
    )
    reference = [*base, f"trainer.precision={plan.precision}"]
    no_liger = None if plan.device == "cuda" and liger_available() else "skipped: needs liger-kernel and CUDA"
    no_fsdp1 = None if plan.device == "cuda" else "skipped: FSDP1 needs CUDA (Lightning refuses FSDP1 on CPU)"
    fp32, bf16 = [*base, "trainer.precision=32-true"], [*base, "trainer.precision=bf16-mixed"]
    one_device = ["trainer.devices=1"]
    spreads = [Check("fp32 against the same fp32 run again", fp32, fp32, repeat=True)]
    if reference != fp32:
        spreads.append(Check(f"{plan.precision} against the same run again", reference, reference, repeat=True))
    return [
        *spreads,
        Check("bf16-mixed against fp32 (32-true)", fp32, bf16),
        Check("loss=chunked against plain", reference, [*reference, "layout.loss=chunked"]),
        Check("loss=liger against plain", reference, [*reference, "layout.loss=liger"], no_liger),
        Check("liger_kernels=true against off", reference, [*reference, "layout.liger_kernels=true"], no_liger),
        Check("compile=model against none", reference, [*reference, "layout.compile=model"]),
        Check(
            "strategy=fsdp2 (1 device) against single device", reference, [*reference, "strategy=fsdp2", *one_device]
        ),
        Check(
            "strategy=fsdp (FSDP1, 1 device) against single device",
            reference,
            [*reference, "strategy=fsdp", *one_device],
            no_fsdp1,
        ),
    ]


def correctness(suite: Suite) -> Table:
    """Each check trains both runs ``--correctness-steps`` steps from the same seed and data,
    logging the loss every step; the reference run is shared by the checks that use it."""
    rows = []
    steps = suite.args.correctness_steps
    for check in correctness_checks(suite):
        row = {"check": check.name, "model": suite.plan.correctness_model, "tolerance": suite.args.tolerance}
        if check.unavailable:
            rows.append({**row, "steps": 0, "result": check.unavailable})
            continue
        reference = suite.run(f"{check.name}: reference", check.reference, steps, 0, every_step=True)
        compared = suite.run(
            f"{check.name}: compared", check.compared, steps, 0, every_step=True, repeat=int(check.repeat)
        )
        row.update(loss_differences(reference, compared))
        failed = next((run.status for run in (reference, compared) if not run.ok), None)
        within = row["max_abs_diff"] is not None and row["max_abs_diff"] <= suite.args.tolerance
        row["result"] = failed or ("pass" if within else "FAIL")
        row["reference_losses"], row["compared_losses"] = reference.losses, compared.losses
        rows.append(row)
    return Table("correctness", CORRECTNESS_COLUMNS, rows)
