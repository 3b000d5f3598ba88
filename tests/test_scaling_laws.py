"""Scaling-law fits: known coefficients from synthetic data, the DiLoCo paper's table, runs on disk."""

import itertools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis.runs import find_runs
from analysis.scaling_laws import (
    PAPER_FITS,
    PAPER_TABLE4,
    PowerLaw,
    Result,
    edge_notes,
    fit_all,
    fit_power_law,
    fit_power_law_offset,
    paper_results,
    relative_differences,
    results_of,
)
from tests.run_helpers import REPO, run_script

SIZES = np.array(list(PAPER_TABLE4))  # the paper's ladder
A, ALPHA, BETA = PAPER_FITS["L(N, M)"]


def noisy(values: np.ndarray, relative: float, seed: int = 0) -> np.ndarray:
    """Multiplicative noise: 1e-4 is a loss measured to about 4 significant digits."""
    return values * (1 + relative * np.random.default_rng(seed).standard_normal(values.shape))


def test_power_law_recovers_its_coefficients_and_the_textbook_standard_error() -> None:
    loss = noisy(A * SIZES**ALPHA, 1e-4)
    law = fit_power_law({"N": SIZES}, loss)
    assert law.a == pytest.approx(A, rel=0.01) and law.exponents[0] == pytest.approx(ALPHA, rel=0.01)
    # The slope's standard error of simple regression, written out: s / sqrt(sum (x - mean x)^2).
    x, y = np.log(SIZES), np.log(loss)
    slope, intercept = np.polyfit(x, y, 1)
    s = np.sqrt(np.sum((y - slope * x - intercept) ** 2) / (len(x) - 2))
    assert law.exponent_ses[0] == pytest.approx(s / np.sqrt(np.sum((x - x.mean()) ** 2)), rel=1e-6)
    assert abs(law.exponents[0] - ALPHA) < 4 * law.exponent_ses[0]


def test_joint_law_recovers_a_alpha_beta_within_one_percent() -> None:
    n, m = (grid.ravel() for grid in np.meshgrid(SIZES, [1.0, 2.0, 4.0, 8.0]))
    exact = fit_power_law({"N": n, "M": m}, A * n**ALPHA * m**BETA)
    assert (exact.a, *exact.exponents) == pytest.approx((A, ALPHA, BETA), rel=1e-9)
    law = fit_power_law({"N": n, "M": m}, noisy(A * n**ALPHA * m**BETA, 1e-4))
    assert (law.a, *law.exponents) == pytest.approx((A, ALPHA, BETA), rel=0.01)
    for estimate, truth, error in zip(law.exponents, (ALPHA, BETA), law.exponent_ses):
        assert abs(estimate - truth) < 4 * error
    assert law.predict(1e10, 4) == pytest.approx(A * 1e10**ALPHA * 4**BETA, rel=1e-3)


def test_offset_law_recovers_the_irreducible_loss() -> None:
    """Besiroglu et al.'s Chinchilla refit (A 482, alpha 0.348, E 1.82) as the truth."""
    sizes = np.geomspace(1e7, 1e10, 8)
    truth = 482.0 * sizes**-0.348 + 1.82
    exact = fit_power_law_offset(sizes, truth)
    assert (exact.a, exact.exponents[0], exact.offset) == pytest.approx((482.0, -0.348, 1.82), rel=1e-6)
    law = fit_power_law_offset(sizes, noisy(truth, 1e-4))
    assert (law.a, law.exponents[0], law.offset) == pytest.approx((482.0, -0.348, 1.82), rel=0.01)
    assert abs(law.offset - 1.82) < 4 * law.offset_se
    # Without the offset the same data fit worse: the curve flattens towards C.
    plain = fit_power_law({"N": sizes}, truth)
    assert np.abs(plain.predict(sizes) - truth).max() > 100 * np.abs(exact.predict(sizes) - truth).max()


def test_offset_law_needs_three_sizes() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        fit_power_law_offset(np.array([1e7, 1e8, 1e8]), np.array([3.0, 2.5, 2.6]))


# How far a refit of the paper's Table 4 may land from the paper's own fits, relative to each
# coefficient. The correct table comes within 0.23% (A) and 0.11% (alpha) per group and within
# 0.15% (A, alpha, beta) jointly; beta, the small replica penalty, gets a wider 2%.
TOLERANCES = (0.005, 0.005, 0.02)  # A, alpha, beta


def outside_tolerance(fits: dict[str, PowerLaw]) -> list[str]:
    """The coefficients, as `fit coefficient`, that miss the paper's fit by more than TOLERANCES."""
    misses = []
    for name, published in PAPER_FITS.items():
        differences = relative_differences(fits[name], published)
        for coefficient, difference, tolerance in zip(("A", "alpha", "beta"), differences, TOLERANCES):
            if abs(difference) > tolerance:
                misses.append(f"{name} {coefficient}")
    return misses


def test_paper_table_reproduces_the_papers_fits() -> None:
    fits = fit_all(paper_results())
    assert outside_tolerance(fits) == []
    # The same least squares on logs of the 28 DiLoCo cells, done independently, to its digits.
    joint = fits["L(N, M)"]
    assert (round(joint.a, 2), round(joint.exponents[0], 4), round(joint.exponents[1], 4)) == (19.25, -0.0986, 0.0116)


def swapped_rows(first: float, second: float) -> dict[float, dict[int | None, float]]:
    """Table 4 with two sizes' losses exchanged."""
    return {n: PAPER_TABLE4[{first: second, second: first}.get(n, n)] for n in PAPER_TABLE4}


def swapped_columns(first: int | None, second: int | None) -> dict[float, dict[int | None, float]]:
    """Table 4 with two groups' losses exchanged at every size."""
    swap = {first: second, second: first}
    return {n: {m: row[swap.get(m, m)] for m in row} for n, row in PAPER_TABLE4.items()}


def with_dp_in_joint_fit() -> dict[str, PowerLaw]:
    """The right per-group fits, but a joint fit that takes the DP column as a fifth M = 1."""
    fits, cells = fit_all(paper_results()), paper_results()
    n, m = np.array([r.n_params for r in cells]), np.array([r.replicas or 1 for r in cells], dtype=float)
    fits["L(N, M)"] = fit_power_law({"N": n, "M": m}, np.array([r.loss for r in cells]))
    return fits


@pytest.mark.parametrize(
    ("corrupted", "missed"),
    [
        (lambda: fit_all(paper_results(swapped_rows(335e6, 550e6))), "L(N) M=8 A"),
        (lambda: fit_all(paper_results(swapped_columns(None, 1))), "L(N) DP A"),
        (lambda: fit_all(paper_results(swapped_columns(4, 8))), "L(N, M) beta"),
        (with_dp_in_joint_fit, "L(N, M) beta"),
    ],
    ids=["335M and 550M rows swapped", "DP and M=1 swapped", "M=4 and M=8 swapped", "DP in the joint fit"],
)
def test_a_corrupted_table_misses_the_papers_fits(corrupted: Callable[[], dict[str, PowerLaw]], missed: str) -> None:
    """The tolerances above are tight enough to catch a table or a fit gone wrong."""
    assert missed in outside_tolerance(corrupted())


def test_a_best_value_at_the_edge_of_the_sweep_is_flagged() -> None:
    """At 1e6 the best LR (2e-3) has worse LRs on both sides; at 1e7 it is the largest tried."""
    results = [Result(1e6, None, loss, lr=lr) for lr, loss in ((1e-3, 3.0), (2e-3, 2.9), (4e-3, 3.1))]
    results += [Result(1e7, 2, loss, lr=lr) for lr, loss in ((2e-3, 2.6), (4e-3, 2.5))]
    notes = edge_notes(results)
    assert len(notes) == 1 and notes[0].startswith("M=2 N=10,000,000: the best inner LR, 0.004")


def llama_parameters(d_model: int, n_layers: int, vocab: int, mlp: int) -> int:
    """Parameters of an untied Llama with as many kv heads as heads, by hand."""
    block = 4 * d_model * d_model + 3 * d_model * mlp + 2 * d_model
    return 2 * vocab * d_model + n_layers * block + d_model


def write_fake_run(folder: Path, d_model: int, replicas: int | None, lr: float, batch: int, loss: float | None) -> None:
    """A run folder as train.py logger=csv leaves it, written by hand."""
    config = {
        "model": {
            "_target_": "lightning_modules.llama_settings.LlamaSettings",
            "vocab_size": 320,
            "n_layers": 2,
            "d_model": d_model,
            "n_heads": 4,
            "n_kv_heads": 4,
            "mlp_hidden": 2 * d_model,
        },
        "optimizer": {"lr": lr},
        "batch": {"global_batch_size": batch},
        "data": {"seq_len": 64},
    }
    if replicas is not None:
        config["technique"] = {"diloco": {"replicas": replicas, "sync_every": 30}}
    (folder / "csv").mkdir(parents=True)
    (folder / "csv" / "hparams.yaml").write_text(yaml.safe_dump(config))
    final = "" if loss is None else f"{loss!r}"
    (folder / "csv" / "metrics.csv").write_text(f"train/tokens_seen,train/loss,val/loss\n100,9.0,\n200,8.0,{final}\n")


WIDTHS = {32: 8, 64: 16, 128: 32}  # d_model -> best global batch


@pytest.fixture
def fake_sweep(tmp_path: Path) -> Path:
    """Three sizes x (DP, M=1, M=2) x two LRs x two batches: the best LR is 0.5 N^-0.3 and the
    best batch WIDTHS[d_model]; 2x either loses 5% or 3%. Then a crashed run, and one M=4 run
    (one size: no fits of its own, one more point of the joint fit)."""
    job = 0
    for d_model, best_batch in WIDTHS.items():
        n = llama_parameters(d_model, 2, 320, 2 * d_model)
        best_lr = 0.5 * n**-0.3
        for replicas in (None, 1, 2):
            loss = A * n**ALPHA * (replicas or 1) ** BETA
            for lr, batch in itertools.product((best_lr, 2 * best_lr), (best_batch, 2 * best_batch)):
                factor = 1 + 0.05 * (lr != best_lr) + 0.03 * (batch != best_batch)
                write_fake_run(tmp_path / "sweep" / str(job), d_model, replicas, lr, batch, loss * factor)
                job += 1
    write_fake_run(tmp_path / "sweep" / str(job), 64, 2, 1e-3, 16, None)  # crashed: no val/loss
    n = llama_parameters(64, 2, 320, 128)
    write_fake_run(tmp_path / "sweep" / str(job + 1), 64, 4, 1e-3, 16, A * n**ALPHA * 4**BETA)  # M=4: one run
    return tmp_path / "sweep"


def test_fits_over_runs_on_disk(fake_sweep: Path) -> None:
    results, notes = results_of(find_runs([fake_sweep]))
    assert len(results) == 37 and len(notes) == 1 and "no val/loss" in notes[0]
    sizes = {llama_parameters(d, 2, 320, 2 * d) for d in WIDTHS}
    assert {r.n_params for r in results} == sizes
    assert {r.replicas for r in results} == {None, 1, 2, 4}
    fits = fit_all(results)
    assert not any(name.endswith("M=4") for name in fits)  # one size: no per-group fit, but in the joint one
    assert (fits["L(N, M)"].a, *fits["L(N, M)"].exponents) == pytest.approx((A, ALPHA, BETA), rel=1e-6)
    assert fits["L(N) DP"].exponents[0] == pytest.approx(ALPHA, rel=1e-6)
    for group in ("DP", "M=1", "M=2"):
        lr = fits[f"inner LR(N) {group}"]
        assert (lr.a, lr.exponents[0]) == pytest.approx((0.5, -0.3), rel=1e-6)
    n = np.log([llama_parameters(d, 2, 320, 2 * d) for d in WIDTHS])
    slope, intercept = np.polyfit(n, np.log([64 * b for b in WIDTHS.values()]), 1)
    batch = fits["batch tokens(N) M=1"]
    assert (batch.exponents[0], batch.a) == pytest.approx((slope, np.exp(intercept)), rel=1e-6)


def test_cli_prints_fits_predicts_and_writes_a_png(fake_sweep: Path, tmp_path: Path) -> None:
    png = tmp_path / "fit.png"
    arguments = [str(fake_sweep), "--predict", "1e6", "--offset", "--out", str(png)]
    result = run_script(REPO / "scripts" / "fit_scaling_laws.py", arguments)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "no val/loss" in result.stderr
    number = r"([-\d.e+]+)\(±[^)]*\)"
    joint = re.search(rf"L\(N, M\): L = {number} N\^{number} M\^{number}", result.stdout)
    assert joint and tuple(map(float, joint.groups())) == pytest.approx((A, ALPHA, BETA), rel=1e-3)
    assert re.search(rf"L\(N\)\+C DP: L = {number} N\^{number} [-+] {number}", result.stdout)
    predicted = re.search(r"L\(N, M\) at N=1e\+06, M=2: ([\d.]+)", result.stdout)
    assert predicted and float(predicted.group(1)) == pytest.approx(A * 1e6**ALPHA * 2**BETA, rel=1e-3)


def test_cli_paper_table_compares_fits_and_extrapolations(tmp_path: Path) -> None:
    png = tmp_path / "paper.png"
    arguments = ["--table", "paper", "--predict", "4e9", "--out", str(png)]
    result = run_script(REPO / "scripts" / "fit_scaling_laws.py", arguments)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "| M=8 | 1,300,000,000 | 2.4930 |" in result.stdout and "| M=8 | 2,400,000,000 | 2.3510 |" in result.stdout
    number = r"([-\d.e+]+)\(±[^)]*\)"
    joint = re.search(
        rf"\| L\(N, M\) \| L = {number} N\^{number} M\^{number} \| L = 19.226 N\^-0.0985 M\^0.0116 \|", result.stdout
    )
    assert joint and tuple(map(float, joint.groups())) == pytest.approx((19.25, -0.0986, 0.0116), rel=2e-3)
    dp = "| L(N) DP | L = 18.17(±0.47) N^-0.09539(±0.0013) | L = 18.129 N^-0.0953 | +0.23% | +0.09% | - |"
    assert dp in result.stdout
    law = fit_all(paper_results())["L(N, M)"]
    assert f"L(N, M) at N=4e+09, M=8: {float(law.predict(4e9, 8)):.4g}" in result.stdout
    at_10b = float(law.predict(1e10, 1))  # beside the paper's measured 2.086
    cell = re.escape(f"| {at_10b:.3f} ({at_10b / 2.086 - 1:+.1%}) |")
    assert re.search(rf"\| 10,000,000,000 \| M=1 \| 2\.086 \| .* {cell}", result.stdout)


def test_cli_takes_runs_or_the_paper_table_not_both(fake_sweep: Path) -> None:
    result = run_script(REPO / "scripts" / "fit_scaling_laws.py", [str(fake_sweep), "--table", "paper"])
    assert result.returncode == 2 and "not both" in result.stderr
