"""A study record replays anywhere: the rounds a search asked are kept in Optuna's journal, so a
resume whose proposals' numerics differ continues the same search; a record another study wrote,
or a storage that cannot be opened, is refused in one line; optuna-dashboard shows the record."""

import json
import math
from pathlib import Path
from unittest import mock
from wsgiref.util import setup_testing_defaults

import pytest

import study.joint_search as model_search
from common.errors import ConfigError
from study.joint_search import forget_asked_rounds, replay
from study.search_record import JOURNAL, LOCK, SearchRecord, fingerprint, open_storage
from study.search_space import Range, SearchSpace
from study.tuner import Search

SPACE = SearchSpace(
    (
        Range("optimizer.lr", 1e-3, 4e-3, "log", 2, 2.5e-4, 3.2e-2),
        Range("technique.diloco.sync_every", 10, 90, "log", 3, 1, 300),
    )
)
ANCHORS = ((0, 0),)
# TPE: the record is the sampler's whatever it is, and TPE asks in milliseconds where the GP takes seconds.
SETTINGS = dict(space=SPACE, sampler="tpe", seed=0, budget=12, round_size=4, anchors=ANCHORS)


def loss(point: tuple[int, ...]) -> float:
    return 1.5 + 0.01 * (point[0] - 2) ** 2 + 0.02 * (point[1] - 1) ** 2


def record(folder: Path, anchors: tuple = ANCHORS) -> SearchRecord:
    storage = open_storage(None, folder)
    return SearchRecord(storage, "m1", fingerprint(Search(SPACE, "tpe", 12, 4, 0, anchors)), folder / LOCK)


def run_rounds(rounds: int, results: dict, rec: SearchRecord | None) -> list[list[tuple[int, ...]]]:
    asked = []
    for _ in range(rounds):
        pending = replay(**SETTINGS, results=results, record=rec).pending
        asked.append(pending)
        results.update({p: loss(p) for p in pending})
    return asked


def test_a_resume_with_other_numerics_continues_the_recorded_search(tmp_path: Path) -> None:
    forget_asked_rounds()
    results: dict = {}
    first_two = run_rounds(2, results, record(tmp_path))
    # Another machine: the sampler proposes other points (here: another seed), the cache is cold.
    forget_asked_rounds()
    original = model_search._sampler
    other = lambda name, seed, startup: original(name, seed + 99, startup)  # noqa: E731
    with mock.patch.object(model_search, "_sampler", other):
        without = replay(**SETTINGS, results=dict(results)).pending
        resumed = replay(**SETTINGS, results=dict(results), record=record(tmp_path))
    # Without the record, the perturbed replay asks for points that never ran: the budget would be spent twice.
    assert set(without) - set(results)
    # With the record, the finished rounds stand as recorded, the searcher's own points with them,
    # and the next round is the third of the same search.
    assert (
        {p for r in first_two for p in r} <= set(results)
        and resumed.pending
        and not set(resumed.pending) & set(results)
    )
    assert (set(first_two[0]) | set(first_two[1])) - set(ANCHORS) <= resumed.own
    trials = record(tmp_path).storage.get_all_trials(record(tmp_path).study_id)
    assert {t.user_attrs["round"] for t in trials} == {0, 1, 2}
    told = [t for t in trials if t.user_attrs["round"] < 2 and t.user_attrs["kind"] != "repeat"]
    assert all(t.value == pytest.approx(loss(tuple(t.params[f"x{a}"] for a in range(2)))) for t in told)


def test_two_workers_recording_the_same_round_keep_the_first(tmp_path: Path) -> None:
    forget_asked_rounds()
    first = record(tmp_path)
    entries = (((1, 1), "own"), ((2, 2), "own"))
    assert first.add_round(0, entries, model_search._distributions(SPACE), {}) == entries
    later = (((3, 3), "own"),)
    assert record(tmp_path).add_round(0, later, model_search._distributions(SPACE), {}) == entries


def test_a_record_another_study_wrote_is_refused(tmp_path: Path) -> None:
    record(tmp_path)
    with pytest.raises(
        ConfigError, match="the study record's search 'm1' was written by another study .* use a new hydra.sweep.dir"
    ):
        record(tmp_path, anchors=((1, 1),))


def test_a_storage_that_cannot_be_opened_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"study.storage='nosuchdb://x' cannot be opened .* sqlite:///study.db"):
        open_storage("nosuchdb://x", tmp_path)


def test_optuna_dashboard_lists_the_recorded_search_and_its_trials(tmp_path: Path) -> None:
    """The dashboard's JSON API (what its page reads), through its WSGI app."""
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    forget_asked_rounds()
    run_rounds(2, {}, record(tmp_path))
    assert (tmp_path / JOURNAL).is_file()
    app = optuna_dashboard.wsgi(open_storage(None, tmp_path))

    def get(path: str) -> dict:
        environ, status = {"PATH_INFO": path}, []
        setup_testing_defaults(environ)
        body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
        assert status[0].startswith("200"), status
        return json.loads(body)

    studies = get("/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == ["m1"]
    trials = get(f"/api/studies/{studies[0]['study_id']}")["trials"]
    complete = [t for t in trials if t["state"] == "Complete"]
    assert (
        len(trials) >= 8 and len(complete) >= 4 and all(math.isfinite(t["values"][0]) for t in complete)
    )  # the last round runs
    assert {p["name"] for p in complete[0]["params"]} == {"x0", "x1"}
