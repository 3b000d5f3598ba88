"""Evaluation and samples while training, against scripts/evaluate.py on the run's own checkpoint.

The in-loop evaluation at the end of training and ``scripts/evaluate.py`` on the final
checkpoint reach the model by two paths (the live training module; the checkpoint file
rebuilt from scratch) and must give the same numbers.
"""

import csv
import json

import pytest

from tests.run_helpers import REPO, TINY, run_script

EVALUATED = TINY + [
    "trainer.max_steps=4",
    "data.val_fraction=0.05",
    "logger=csv",
    "evaluation=corpus_cloze",
    "evaluation.cloze_items=40",
    "evaluation.every_n_tokens=1000",  # steps of 256 tokens: after steps 4 (1024) and at the end
    "samples=default",
    "samples.every_n_tokens=1000",
    "samples.max_new_tokens=8",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    cache = tmp_path_factory.mktemp("cache")
    result = run_script(REPO / "train.py", [f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache}", *EVALUATED])
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result.stdout + result.stderr


def logged(run_dir, key: str) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as file:
        return {int(float(row["train/tokens_seen"])): float(row[key]) for row in csv.DictReader(file) if row.get(key)}


def test_evaluation_is_logged_against_tokens_and_equals_the_checkpoints(run, tmp_path):
    run_dir, _ = run
    accuracy = logged(run_dir, "eval/corpus_cloze/acc")
    assert list(accuracy) == [1024]  # due at 1,000 tokens, reached at the end of step 4: once, not twice
    assert set(logged(run_dir, "eval/corpus_cloze/acc_norm")) == {1024}
    out = tmp_path / "results.json"
    arguments = [
        str(run_dir / "checkpoints" / "last.ckpt"),
        "--tasks",
        "corpus_cloze",
        "--cloze-k",
        "40",
        "--out",
        str(out),
    ]
    result = run_script(REPO / "scripts" / "evaluate.py", arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(out.read_text())["results"]["corpus_cloze"]
    assert accuracy[1024] == pytest.approx(results["acc,none"], abs=1e-12)
    assert logged(run_dir, "eval/corpus_cloze/acc_norm")[1024] == pytest.approx(results["acc_norm,none"], abs=1e-12)


def test_samples_are_printed_with_their_prompt(run):
    _, output = run
    lines = [line for line in output.splitlines() if "sample at 1,024 tokens: 'The old man' -> " in line]
    assert len(lines) == 1


def test_the_report_plots_and_tabulates_evaluation_metrics(run, tmp_path):
    run_dir, _ = run
    result = run_script(REPO / "scripts" / "report.py", [str(run_dir), "--out", str(tmp_path)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "eval_corpus_cloze_acc.png").is_file()
    assert "eval/corpus_cloze/acc" in (tmp_path / "report.md").read_text()
