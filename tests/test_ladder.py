"""The scaling ladder: its sizes against the parameter formula, fits that recover known laws,
a held-out prediction that never reads the predicted size's runs, trend claims against a
textbook regression, and its bad inputs (one line, exit code 2)."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from scipy import stats

from analysis.ladder import Rung, fit_loss, predict
from analysis.runs import find_runs
from common.errors import ConfigError
from lightning_modules.llama import count_parameters
from lightning_modules.llama_settings import LlamaSettings
from study.archive import machine_of
from study.preset import StudySpec
from study.report import every_size_trends, study_report
from study.trend import TrendPoint, judge_trend, slope
from tests.run_helpers import REPO, compose_config, run_script, run_train, tiny_study

SIZES = ["ladder_0_1m", "ladder_0_3m", "ladder_0_65m", "ladder_1_2m", "ladder_2_1m"]


def formula(n_layers: int, d_model: int, vocab: int) -> int:
    """Attention 4 d^2 and a 3-matrix MLP of width 4 d per block, two norms per block and a
    final one, untied input and output embeddings."""
    return n_layers * (4 * d_model**2 + 3 * d_model * 4 * d_model + 2 * d_model) + d_model + 2 * vocab * d_model


@pytest.mark.parametrize("name", SIZES)
def test_each_ladder_size_composes_and_matches_the_parameter_formula(name: str, tmp_path: Path) -> None:
    cfg = compose_config([f"model={name}"], tmp_path)
    model = {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k != "_target_"}
    assert model["d_model"] == 24 * model["n_layers"] and model["d_model"] % model["n_heads"] == 0
    assert model["mlp_hidden"] == 4 * model["d_model"] and model["n_kv_heads"] == model["n_heads"]
    n = count_parameters(LlamaSettings(**model))
    assert n == formula(model["n_layers"], model["d_model"], model["vocab_size"])
    nominal = float(name.removeprefix("ladder_").removesuffix("m").replace("_", ".")) * 1e6
    assert abs(n / nominal - 1) < 0.1  # the name says the size


LAW = {"a": 30.0, "alpha": -0.3, "c": 1.5}
N = [104_688, 295_416, 652_128, 1_230_120, 2_084_688]


def law(n: float) -> float:
    return LAW["a"] * n ** LAW["alpha"] + LAW["c"]


def rung(model: str, n: int, losses: dict[int, float], method: str = "dp") -> Rung:
    return Rung(method, model, n, None if method == "dp" else 2, losses, 4e-3)


def test_the_fit_recovers_a_known_law_with_an_irreducible_term() -> None:
    members = [rung(name, n, {2: law(n)}) for name, n in zip(SIZES, N)]
    fitted = fit_loss(members)
    assert fitted.exponents[0] == pytest.approx(LAW["alpha"], rel=1e-3)
    assert fitted.offset == pytest.approx(LAW["c"], rel=1e-3) and fitted.a == pytest.approx(LAW["a"], rel=1e-2)
    # Three sizes cannot support the offset: a plain power law, still through the points.
    three = fit_loss(members[:3])
    assert three.offset_se is None and three.predict(np.array(N[:3])) == pytest.approx(
        [law(n) for n in N[:3]], rel=1e-2
    )


def test_the_prediction_brackets_the_held_out_size_and_ignores_it() -> None:
    generator = np.random.default_rng(0)
    members = [rung(name, n, {s: law(n) + generator.normal(0, 0.005) for s in (2, 3, 4)}) for name, n in zip(SIZES, N)]
    (prediction,) = predict(members, SIZES[:4], SIZES[4], N[4])
    assert prediction.fitted_on == SIZES[:4] and prediction.low < law(N[4]) < prediction.high
    assert abs(prediction.predicted / law(N[4]) - 1) < 0.01
    (again,) = predict(members[:4], SIZES[:4], SIZES[4], N[4])  # the held-out rung gone: the same
    assert again == prediction
    with pytest.raises(ConfigError, match="would be fitted on ladder_2_1m itself"):
        predict(members, SIZES, SIZES[4], N[4])
    with pytest.raises(ConfigError, match="the dp fit has 2 size"):
        predict(members, SIZES[:2], SIZES[4], N[4])


def test_the_prediction_interval_holds_the_other_forms_the_refits_and_the_seed_noise() -> None:
    generator = np.random.default_rng(1)
    members = [
        rung(name, n, {s: law(n) + generator.normal(0, 0.01) for s in (2, 3)}) for name, n in zip(SIZES[:4], N[:4])
    ]
    (prediction,) = predict(members, SIZES[:4], SIZES[4], N[4], seeds=2)
    assert prediction.form == "A N^alpha + C"

    # Written out here: the plain law on all four sizes and on each three-size subset (the
    # offset form needs four), and the offset form on all four.
    def plain(subset):
        slope_, intercept = np.polyfit(np.log([r.n_params for r in subset]), np.log([r.loss for r in subset]), 1)
        return math.exp(intercept + slope_ * math.log(N[4]))

    candidates = [plain(members)] + [plain([r for r in members if r is not out]) for out in members]
    candidates.append(fit_loss(members).predict(np.array([N[4]]))[0])
    residuals = [v - r.loss for r in members for v in r.losses.values()]
    noise = stats.t.ppf(0.975, 4) * math.sqrt(sum(e * e for e in residuals) / 4) / math.sqrt(2)
    low, high = min(prediction.low, *candidates) - noise, max(prediction.high, *candidates) + noise
    assert (prediction.interval_low, prediction.interval_high) == pytest.approx(
        (low, high), rel=1e-5
    )  # t from a 3-digit table
    assert prediction.interval_low < prediction.low and prediction.interval_high > prediction.high


def test_the_trend_slope_and_interval_equal_scipys_regression_on_per_size_means() -> None:
    scatter = dict(zip(N, (0.001, -0.0015, 0.0005, 0.002, -0.001)))
    points = [TrendPoint(n, s, 0.05 - 0.01 * math.log10(n) + scatter[n] + 0.002 * s) for n in N for s in (2, 3)]
    estimate = slope(points)
    means = [np.mean([p.difference for p in points if p.n_params == n]) for n in N]
    fit = stats.linregress(np.log10(N), means)  # 5 sizes: 3 degrees of freedom, not the 8 of 10 points
    half = stats.t.ppf(0.975, len(N) - 2) * fit.stderr
    assert (estimate.value, *estimate.bounds(0.025)) == pytest.approx(
        (fit.slope, fit.slope - half, fit.slope + half), rel=1e-3
    )
    preset = OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder.yaml")
    spec = StudySpec.from_config(OmegaConf.to_container(preset.study))
    assert judge_trend(spec.claims[0], points).verdict == "holds"  # the gap falls by 0.01 nats per decade
    rising = [TrendPoint(p.n_params, p.seed, -p.difference) for p in points]
    assert judge_trend(spec.claims[0], rising).verdict == "fails"
    assert judge_trend(spec.claims[0], []).verdict == "not run"


def test_a_trend_claim_tests_a_slope_not_a_ratio() -> None:
    with pytest.raises(ConfigError, match="a trend claim tests a slope; drop the ratio_ prefix"):
        StudySpec.from_config(
            {
                "arms": {"a": [], "b": []},
                "seeds": [1, 2],
                "claims": [
                    {"arm": "a", "baseline": "b", "trend": "params", "expect": {"val/loss": {"ratio_lower_than": 1}}}
                ],
            }
        )


def write_run(
    folder: Path,
    model: str,
    arm: str,
    seed: int,
    loss: float,
    study: dict | None = None,
    settings: tuple = (),
    phase: str = "judge",
) -> None:
    """A finished run as the CSV logger and the sweep leave it (``study``: the preset's block;
    ``settings``: the searched overrides it ran with; ``phase``: judging or tuning)."""
    (folder / "csv").mkdir(parents=True)
    (folder / ".hydra").mkdir()
    shape = yaml.safe_load((REPO / "conf" / "model" / f"{model}.yaml").read_text())
    config = {
        "model": shape,
        "seed": seed,
        "study": {**(study or {}), "arm": arm, "phase": phase},
        "optimizer": {"lr": 4e-3},
    }
    (folder / "csv" / "hparams.yaml").write_text(yaml.safe_dump(config))
    (folder / "csv" / "metrics.csv").write_text(f"step,train/tokens_seen,val/loss\n10,1000,{loss}\n")
    (folder / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"model={model}", *settings, f"study.arm={arm}", f"++study.phase={phase}", f"seed={seed}"])
    )
    (folder / "finished.yaml").write_text("metrics: {}\n")


def ladder(cli: list[str]) -> subprocess.CompletedProcess:
    return run_script(REPO / "scripts" / "ladder.py", cli)


def test_the_prediction_command_never_reads_the_predicted_size(tmp_path: Path) -> None:
    sweep, job = tmp_path / "sweep", 0
    for name, n in zip(SIZES, N):
        for seed in (2, 3):
            write_run(sweep / str(job), name, "dp", seed, law(n) + 0.003 * (seed - 2.5))
            job += 1
    result = ladder(["predict", str(sweep)])
    assert result.returncode == 0, result.stderr
    first = (sweep / "ladder_prediction.yaml").read_text()
    assert "ladder_2_1m" in result.stdout and yaml.safe_load(first)[0]["fitted_on"] == SIZES[:4]
    for folder in (sweep / "8", sweep / "9"):  # the largest size's runs
        for path in sorted(folder.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        folder.rmdir()
    kept = ladder(["predict", str(sweep), "--predict", "ladder_2_1m"])  # a recorded prediction is never replaced
    assert kept.returncode == 2 and "ladder_prediction.yaml exists" in kept.stderr
    (sweep / "ladder_prediction.yaml").unlink()
    result = ladder(["predict", str(sweep), "--predict", "ladder_2_1m"])
    assert result.returncode == 0, result.stderr
    assert (sweep / "ladder_prediction.yaml").read_text() == first
    write_run(sweep / "20", "ladder_2_1m", "dp", 2, 9.9)  # a held-out run still training: not measured yet
    (sweep / "20" / "finished.yaml").unlink()
    report = ladder(["report", str(sweep), "--out", str(tmp_path / "report")])
    assert report.returncode == 0, report.stderr
    assert "| dp | ladder_2_1m | 2,084,688 | its own search |" in report.stdout and "| not run | - |" in report.stdout
    here = machine_of(sweep / "0")  # no run was restored: every one trained on this machine
    assert (
        f"| ladder_0_1m | judge | {here} | 2 | 0.00 |" in report.stdout and "| all | | | 8 |" in report.stdout
    )  # the unfinished run left out
    # Bad input: a size in the fit and the prediction, and too few sizes for a fit.
    (sweep / "ladder_prediction.yaml").unlink()
    refused = ladder(["predict", str(sweep), "--predict", "ladder_1_2m", "--sizes", *SIZES[:4]])
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: the prediction for ladder_1_2m would be fitted on ladder_1_2m itself: leave it out of --sizes."
    ]
    few = ladder(["predict", str(sweep), "--predict", "ladder_2_1m", "--sizes", *SIZES[:2]])
    assert few.returncode == 2 and few.stderr.strip().splitlines()[0].startswith("error: the dp fit has 2 size(s)")


def test_a_size_whose_heads_do_not_divide_its_width_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "model=ladder_0_3m",
            "model.n_heads=5",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "n_heads" in line


HELD_OUT = [*tiny_study("tiny_tuned", searched=("model.", "optimizer.lr=", "token_budget=")), "study.arm=tuned"]


def test_a_held_out_size_is_not_searched_and_its_prediction_is_written_before_it_trains(tmp_path: Path) -> None:
    folder, sizes = tmp_path / "sweep", "model=ladder_0_1m,ladder_0_3m,ladder_0_65m,ladder_1_2m"
    command = [*HELD_OUT, sizes, "+study.held_out=ladder_1_2m", f"hydra.sweep.dir={folder}"]
    result = run_train(command, tmp_path / "unused", tmp_path / "cache")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = find_runs([folder])
    held = [run for run in runs if run.setting("model.name") == "ladder_1_2m"]
    assert sorted((run.phase, run.seed) for run in held) == [("held_out", 2), ("held_out", 3)]  # never searched
    # The others' winners all sit at the search's hard limit (1.6e-2): so must the fitted LR.
    winners = {run.setting("optimizer.lr") for run in runs if run.phase == "judge"}
    assert winners == {1.6e-2} and {run.setting("optimizer.lr") for run in held} == {1.6e-2}
    (prediction,) = yaml.safe_load((folder / "ladder_prediction.yaml").read_text())
    assert prediction["fitted_on"] == ["ladder_0_1m", "ladder_0_3m", "ladder_0_65m"] and prediction["settings"] == [
        "optimizer.lr=0.016"
    ]
    log = result.stdout + result.stderr
    assert log.index("held-out tuned at ladder_1_2m: predicted") < log.index("2 held_out jobs")
    again = run_train(command, tmp_path / "unused", tmp_path / "cache")  # resumes: nothing left, the prediction kept
    assert again.returncode == 0 and "finished at step" not in again.stdout + again.stderr
    assert yaml.safe_load((folder / "ladder_prediction.yaml").read_text()) == [prediction]


@pytest.mark.parametrize(
    ("sizes", "held_out", "message"),
    [
        (
            "model=ladder_0_1m,ladder_0_3m,ladder_0_65m",
            "ladder_2_1m",
            "error: study.held_out=ladder_2_1m is not one of the sizes this study runs (model=ladder_0_1m,ladder_0_3m,ladder_0_65m); name one of them.",
        ),
        (
            "model=ladder_0_1m,ladder_0_3m,ladder_0_65m",
            "ladder_0_65m",
            "error: study.held_out: the ladder has 2 other size(s); fitting over N needs at least 3: add sizes to model=..., or drop study.held_out.",
        ),
    ],
)
def test_a_held_out_size_the_ladder_cannot_fit_is_one_line_before_any_job(
    sizes: str, held_out: str, message: str, tmp_path: Path
) -> None:
    folder = tmp_path / "sweep"
    result = run_train(
        [*HELD_OUT, sizes, f"+study.held_out={held_out}", f"hydra.sweep.dir={folder}"],
        tmp_path / "unused",
        tmp_path / "cache",
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [message]
    assert not folder.exists()


def judged_ladder(
    sweep: Path, gaps: dict[str, float], shifted: dict[tuple[str, str], float] | None = None
) -> list[int]:
    """Judging runs of the tuned ladder's three arms at its four searched sizes, seeds 2 and 3:
    each DiLoCo arm ``gaps[arm]`` above data parallelism at 0.1M, falling 0.05 per decade of
    N, plus ``shifted[(arm, size)]``; returns the sizes' parameter counts."""
    preset = OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder_tuned.yaml")
    study = OmegaConf.to_container(preset.study)
    job, sizes = 0, []
    for model in SIZES[:4]:
        shape = yaml.safe_load((REPO / "conf" / "model" / f"{model}.yaml").read_text())
        n = count_parameters(LlamaSettings(**{k: v for k, v in shape.items() if k != "_target_"}))
        sizes.append(n)
        for arm in ("dp", "m1", "m2"):
            for seed, noise in ((2, 0.001), (3, -0.001)):
                gap = (
                    gaps[arm] - 0.05 * math.log10(n / 104_688) + (shifted or {}).get((arm, model), 0.0)
                    if arm in gaps
                    else 0.0
                )
                write_run(sweep / str(job), model, arm, seed, 2.0 + gap + noise, study)
                job += 1
    return sizes


def test_a_ladder_report_judges_plain_claims_at_each_size_and_trends_across_them(tmp_path: Path) -> None:
    """The tuned ladder's claims on finished judging runs of four sizes: the per-size claim at
    every size (named by its size), each trend once, its slope scipy's on the per-size means."""
    gaps = {"m1": -0.02, "m2": 0.03}  # at 0.1M; each falls by 0.05 per decade of N
    sizes = judged_ladder(tmp_path / "sweep", gaps)
    report = study_report([tmp_path / "sweep"])
    texts = [v.claim.claim for v in report.verdicts]
    per_size = [t for t in texts if t.startswith("DiLoCo M = 1 ends lower")]
    assert [t.split("[")[-1] for t in per_size] == [f"model={m}]" for m in SIZES[:4]]
    trends = {v.claim.arm: v for v in report.verdicts if v.claim.trend}
    assert set(trends) == {"m1", "m2"} and all(v.verdict == "holds" for v in trends.values())
    fit = stats.linregress(np.log10(sizes), [gaps["m2"] - 0.05 * math.log10(n / 104_688) for n in sizes])
    assert f"slope per decade of N {fit.slope:.4g}" in trends["m2"].measured[0]
    assert every_size_trends(report) == []  # every size tuned: nothing to add


def test_a_size_whose_search_is_not_tuned_leaves_the_trend_and_the_exploratory_view_counts_it(
    tmp_path: Path,
) -> None:
    """M = 2's search at 0.3M and M = 1's at 0.65M have run one point of their budgets (not
    tuned): each trend claim is judged on its arm's other three sizes, the exploratory trends
    on all four (scipy's slopes on the per-size mean gaps)."""
    gaps, bump = {"m1": -0.02, "m2": 0.03}, 0.1
    untuned = {("m2", "ladder_0_3m"): bump, ("m1", "ladder_0_65m"): -bump}
    sweep = tmp_path / "sweep"
    sizes = judged_ladder(sweep, gaps, untuned)
    study = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder_tuned.yaml").study)
    searched = ("optimizer.lr=0.004", "technique.diloco.outer_lr=0.707107", "technique.diloco.sync_every=3")
    for arm, model in untuned:
        write_run(sweep / f"tune_{arm}", model, arm, 1, 2.1, study, searched, "tune")
    report = study_report([sweep])
    trends = {v.claim.arm: v for v in report.verdicts if v.claim.trend}
    explored = {v.claim.arm: v for v in every_size_trends(report)}
    assert set(explored) == {"m1", "m2"} and explored["m2"].claim.claim.endswith("(every size, exploratory)")
    for arm, left_out in (("m2", 1), ("m1", 2)):
        gap = [
            gaps[arm] - 0.05 * math.log10(n / 104_688) + untuned.get((arm, SIZES[i]), 0.0) for i, n in enumerate(sizes)
        ]
        kept = [i for i in range(4) if i != left_out]
        fit = stats.linregress(np.log10([sizes[i] for i in kept]), [gap[i] for i in kept])
        everywhere = stats.linregress(np.log10(sizes), gap)
        assert f"slope per decade of N {fit.slope:.4g}" in trends[arm].measured[0], trends[arm].measured
        assert f"slope per decade of N {everywhere.slope:.4g}" in explored[arm].measured[0], explored[arm].measured
        assert abs(everywhere.slope - fit.slope) > 0.01  # the bump moves the slope: the two views differ


def test_the_ladder_report_fits_each_searched_setting_and_draws_it(tmp_path: Path) -> None:
    """Winners read from the judging runs' overrides: data parallelism's LR halving per size is
    a power law, M = 1's H at 10 everywhere a constant; a figure per setting; a search begun
    is shown as it stands."""
    preset = OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder_tuned.yaml")
    study = OmegaConf.to_container(preset.study)
    lrs = {"ladder_0_1m": "0.016", "ladder_0_3m": "0.008", "ladder_0_65m": "0.004", "ladder_1_2m": "0.001"}
    sweep, job = tmp_path / "sweep", 0
    for model, lr in lrs.items():
        for arm, settings in (
            ("dp", (f"optimizer.lr={lr}",)),
            ("m1", ("optimizer.lr=0.004", "technique.diloco.outer_lr=0.707107", "technique.diloco.sync_every=10")),
        ):
            for seed in (2, 3):
                write_run(sweep / str(job), model, arm, seed, 2.0 + 0.01 * seed, study, settings)
                job += 1
    for lr, loss in (("0.004", 2.05), ("0.008", 2.0)):  # the smallest size's search, begun
        write_run(sweep / str(job), "ladder_0_1m", "dp", 1, loss, study, (f"optimizer.lr={lr}",), phase="tune")
        job += 1
    result = ladder(["report", str(sweep), "--out", str(tmp_path / "out")])
    assert result.returncode == 0, result.stderr[-2000:]
    (search,) = [line for line in result.stdout.splitlines() if line.startswith("| dp | gp")]
    assert "| 2 | optimizer.lr=0.008 | 2.0000 (tuning seeds) | lr: not bracketed |" in search, search
    sizes = [
        count_parameters(
            LlamaSettings(
                **{
                    k: v
                    for k, v in yaml.safe_load((REPO / "conf" / "model" / f"{m}.yaml").read_text()).items()
                    if k != "_target_"
                }
            )
        )
        for m in lrs
    ]
    fit = stats.linregress(np.log(sizes), np.log([float(v) for v in lrs.values()]))
    (dp_lr,) = [line for line in result.stdout.splitlines() if line.startswith("- dp, best optimizer.lr = ")]
    assert f"N^{fit.slope:.3g}" in dp_lr, dp_lr
    (h,) = [line for line in result.stdout.splitlines() if line.startswith("- m1, best technique.diloco.sync_every")]
    # every size's winner is 10: said so, not as an exponent interval of zero width
    assert h == "- m1, best technique.diloco.sync_every: constant (every size's winner), 10", h
    assert {p.name for p in (tmp_path / "out").glob("ladder_*.png")} >= {
        "ladder_lr.png",
        "ladder_outer_lr.png",
        "ladder_sync_every.png",
    }


def test_the_gap_figure_marks_each_size_whose_search_is_not_tuned() -> None:
    """The (method, size) pairs drawn hollow: read from each search's label, whatever else it crosses."""
    from types import SimpleNamespace

    from scripts.ladder import not_tuned

    tunings = {
        ("dp", "model=ladder_0_1m token_budget=418752"): SimpleNamespace(tuned=False),
        ("m1", "token_budget=1181664 model=ladder_0_3m"): SimpleNamespace(tuned=False),
        ("m1", "model=ladder_0_65m token_budget=2608512"): SimpleNamespace(tuned=True),
        ("m2", "seed=3"): SimpleNamespace(tuned=False),  # no size: not a ladder's search
    }
    assert not_tuned(tunings) == {("dp", "ladder_0_1m"), ("m1", "ladder_0_3m")}


def test_the_compute_table_splits_each_size_by_the_machine_its_runs_trained_on(tmp_path: Path) -> None:
    """A study carried across machines by its archive: restored runs are counted under the
    machine their archive recorded, the rest under this one."""
    from scripts.ladder import compute_table
    from study.archive import RESTORED

    judged_ladder(tmp_path / "sweep", {"m1": -0.02, "m2": 0.03})
    for job in range(6):  # the 0.1M size's six judging runs came from an archive
        (tmp_path / "sweep" / str(job) / RESTORED).write_text("machine: Other CPU, AVX512 kernels\n")
    table = compute_table(find_runs([tmp_path / "sweep"])).splitlines()
    here = machine_of(tmp_path / "sweep" / "6")
    assert "| ladder_0_1m | judge | Other CPU, AVX512 kernels | 6 | 0.00 |" in table
    assert f"| ladder_0_3m | judge | {here} | 6 | 0.00 |" in table and here.endswith(" kernels")


def test_the_size_table_gives_each_method_s_losses_and_its_paired_gap_to_data_parallelism(tmp_path: Path) -> None:
    """Seeds 2 and 3 at each size, 0.001 above and below each arm's loss: the means and stds
    and the gaps written into the runs come back (and a seed data parallelism lacks is not
    paired)."""
    from analysis.ladder import rungs
    from scripts.ladder import size_table

    gaps = {"m1": -0.02, "m2": 0.03}
    sizes = judged_ladder(tmp_path / "sweep", gaps)
    study = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder_tuned.yaml").study)
    write_run(tmp_path / "sweep" / "extra", "ladder_0_1m", "m2", 4, 2.5, study)  # no data-parallel seed 4
    table = size_table(rungs(find_runs([tmp_path / "sweep"]))).splitlines()
    assert table[0] == "| size | N | dp | m1 | m2 | m1 - dp (paired) | m2 - dp (paired) |"
    spread = np.std([0.001, -0.001], ddof=1)
    m2 = np.mean([2.03 + 0.001, 2.03 - 0.001, 2.5])
    m2_spread = np.std([2.03 + 0.001, 2.03 - 0.001, 2.5], ddof=1)
    assert table[2] == (
        f"| ladder_0_1m | {sizes[0]:,} | 2.0000 ± {spread:.4f} (2) | 1.9800 ± {spread:.4f} (2)"
        f" | {m2:.4f} ± {m2_spread:.4f} (3) | -0.0200 (2) | +0.0300 (2) |"
    )
    gap = gaps["m2"] - 0.05 * math.log10(sizes[3] / 104_688)
    assert table[5].endswith(f"| {gap:+.4f} (2) |"), table[5]


def test_the_report_judges_each_arm_at_its_current_winner_only(tmp_path: Path) -> None:
    """A winner that changed when a study was resumed under another pick (the tuned ladder's
    data parallelism at 0.3M: 5.66e-3, then 4e-3) leaves its predecessor's judging runs in the
    folder: the report judges the arm on the winner's runs alone (before: two groups of one arm,
    so the claim said no finished run of it)."""
    preset = OmegaConf.load(REPO / "conf" / "sweep" / "scaling_ladder_tuned.yaml")
    study = OmegaConf.to_container(preset.study)
    sweep, job = tmp_path / "sweep", 0

    def run(model: str, arm: str, seed: int, loss: float, settings: tuple, phase: str = "judge") -> None:
        nonlocal job
        write_run(sweep / str(job), model, arm, seed, loss, study, settings, phase)
        job += 1

    for lr, loss in (("0.004", 2.05), ("0.008", 2.0)):  # the search as it stands: 8e-3 leads
        run("ladder_0_1m", "dp", 1, loss, (f"optimizer.lr={lr}",), "tune")
    for seed in (2, 3):
        run("ladder_0_1m", "dp", seed, 2.5, ("optimizer.lr=0.004",))  # an earlier winner's judging runs
        run("ladder_0_1m", "dp", seed, 2.0 + 0.01 * seed, ("optimizer.lr=0.008",))
        run("ladder_0_3m", "dp", seed, 1.8, ("optimizer.lr=0.008",))
    report = study_report([sweep])
    from study.report import at_winners, judging_groups

    kept = at_winners(report.spec, judging_groups(report.groups), report.tunings)
    at_small = [g for g in kept if g.arm == "dp" and "model=ladder_0_1m" in g.runs[0].overrides]
    (group,) = at_small
    assert {r.setting("seed") for r in group.runs} == {2, 3} and "optimizer.lr=0.008" in group.runs[0].overrides
    assert len([g for g in judging_groups(report.groups) if g.arm == "dp"]) == 3
