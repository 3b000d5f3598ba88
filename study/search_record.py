"""A tuned study's record: every round a search asked and every result it was told, in Optuna's storage.

The joint search (``study/joint_search.py``) replays its rounds from the finished runs. A
replay on another machine, another library version or another CPU's float kernels may
propose a different point somewhere; without a record the finished runs after it would never
be told and the search would spend its budget again. With a record, each round is written
once, by the first worker that asks it, and every later replay (a resume, a second worker,
another machine) takes the recorded points instead of asking again: the search continues
from what it asked, whatever the numerics.

The record is an Optuna storage (``study.storage``): by default a journal file in the sweep
folder (``optuna_journal.log``, Optuna's ``JournalFileBackend``: an append-only file that
several processes sharing the folder may write), or any storage URL Optuna opens (an RDB
such as ``sqlite:///study.db`` or ``postgresql://...`` for a cluster). Each search is one
Optuna study, named for its arm (and the values the study was crossed with); each asked point
is a trial with the user attributes ``round``, ``position`` and ``kind`` (``anchor``, ``own``:
the searcher's new point, or ``repeat``: a point the searcher chose again, told at once), and
its value is the loss the searcher was told (a diverged run's as the worst loss + 1; the
measured loss is the attribute ``loss``). ``optuna-dashboard <storage>`` shows the searches
live. A study keeps the search's settings as an attribute, so a record written by another
study (another space, searcher, seed or anchors) is refused before any job starts.
"""

import fcntl
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import ConfigError
from study.search_space import Point

if TYPE_CHECKING:
    from study.tuner import Search

JOURNAL = "optuna_journal.log"
LOCK = "search_record.lock"
ANCHOR, OWN, REPEAT = "anchor", "own", "repeat"
#: One recorded round: each point with its kind, in the order it was asked.
Round = tuple[tuple[Point, str], ...]


def open_storage(storage: str | None, sweep_dir: Path) -> Any:
    """The Optuna storage of ``study.storage`` (None: the journal file in the sweep folder);
    a storage that cannot be opened is a ConfigError naming the setting."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    where = storage or str(sweep_dir / JOURNAL)
    try:
        if "://" in where:
            return optuna.storages.RDBStorage(where)
        Path(where).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(where))
    except Exception as error:
        raise ConfigError(
            f"study.storage={where!r} cannot be opened ({type(error).__name__}: {error}); give a journal file path"
            " or a storage URL such as sqlite:///study.db, or null for the sweep folder's journal."
        ) from None


def search_name(arm: str, base: list[str]) -> str:
    """A search's study name: its arm, and the values its base job sets (sorted), if any."""
    return " ".join([arm, *sorted(base)])


def fingerprint(search: "Search") -> str:
    """What a search's record must have been written with to be continued (the budget may
    grow): its preset's settings, so a ladder's previous-size anchor is named, not its point."""
    settings = {
        "space": repr(search.space),
        "searcher": search.searcher,
        "seed": search.seed,
        "round_size": search.round_size,
        "anchors": [list(a) for a in search.anchors],
    }
    if search.previous_size_anchor:
        settings["previous_size_anchor"] = True
    return json.dumps(settings)


def written_by_another(storage: Any, name: str, print_: str) -> str | None:
    """The other search settings a record's study ``name`` was written with, if any."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    written = storage.get_study_user_attrs(study_id).get("search")
    return None if written == print_ else str(written)


def check_record(storage: Any, name: str, print_: str) -> None:
    """A record written by another study is refused in one line."""
    if (written := written_by_another(storage, name, print_)) is not None:
        raise ConfigError(
            f"the study record's search {name!r} was written by another study ({written}); this study searches"
            f" {print_}: use a new hydra.sweep.dir (or study.storage), or restore the preset that wrote it."
        )


class SearchRecord:
    """One search's rounds in the storage: read, written once under a lock, told."""

    def __init__(self, storage: Any, name: str, print_: str, lock: Path, read_only: bool = False) -> None:
        """``read_only``: a reader's view (the report), which never writes a round or a result."""
        import optuna

        check_record(storage, name, print_)
        self.storage, self.name, self.lock_path, self.read_only = storage, name, lock, read_only
        if read_only:
            self.study_id = storage.get_study_id_from_name(name)
            return
        study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
        self.study_id = study._study_id
        storage.set_study_user_attr(self.study_id, "search", print_)

    def _trials(self) -> list:
        return self.storage.get_all_trials(self.study_id, deepcopy=False)

    def round(self, k: int) -> Round | None:
        """Round ``k`` as recorded (None: not asked yet)."""
        found = sorted((t.user_attrs["position"], t) for t in self._trials() if t.user_attrs.get("round") == k)
        if not found:
            return None
        return tuple(
            (tuple(t.params[f"x{axis}"] for axis in range(len(t.params))), t.user_attrs["kind"]) for _, t in found
        )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def add_round(self, k: int, entries: Round, distributions: dict, told: dict[Point, float]) -> Round:
        """Record round ``k`` unless a worker did first; returns what the record holds. A repeat
        is recorded complete, with the value it was told."""
        from optuna.trial import TrialState, create_trial

        if self.read_only:
            return entries
        with self._locked():
            if (kept := self.round(k)) is not None:
                return kept
            for position, (point, kind) in enumerate(entries):
                params = {f"x{axis}": index for axis, index in enumerate(point)}
                attrs = {"round": k, "position": position, "kind": kind}
                done = kind == REPEAT
                trial = create_trial(
                    params=params,
                    distributions=distributions,
                    user_attrs=attrs,
                    state=TrialState.COMPLETE if done else TrialState.RUNNING,
                    value=told[point] if done else None,
                )
                self.storage.create_new_trial(self.study_id, template_trial=trial)
        return entries

    def tell(self, k: int, told: list[tuple[Point, float, float]]) -> None:
        """Complete round ``k``'s trials with the value the searcher was told for each point
        (and its measured loss), those not completed yet."""
        from optuna.trial import TrialState

        if self.read_only:
            return
        by_point = {point: (value, loss) for point, value, loss in told}
        for trial in self._trials():
            point = tuple(trial.params[f"x{axis}"] for axis in range(len(trial.params)))
            if trial.user_attrs.get("round") == k and trial.state == TrialState.RUNNING and point in by_point:
                value, loss = by_point[point]
                self.storage.set_trial_user_attr(trial._trial_id, "loss", loss if math.isfinite(loss) else str(loss))
                self.storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [value])
