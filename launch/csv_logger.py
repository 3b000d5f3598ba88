"""A CSV logger that continues a run's ``metrics.csv`` instead of deleting it.

Lightning's ``CSVLogger`` deletes the metrics file of a folder it finds non-empty. A sweep
job that resumes in its own folder (``launch/sweep_jobs.py``) must keep the rows it logged
before the interruption, so this logger appends to them, widening the header when new
columns appear. Rows the resumed run logs again (the steps after its last checkpoint)
follow the old ones; ``analysis/runs.py`` keeps the newer of each. A new run folder, the
usual case, gets a new file as with Lightning's logger.
"""

import csv

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class AppendingWriter(ExperimentWriter):
    """Lightning's writer, taking the header of an existing metrics file instead of deleting it."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = list(next(csv.reader(file), []))


class AppendingCSVLogger(CSVLogger):
    """``CSVLogger`` with the appending writer (same arguments)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingWriter(log_dir=self.log_dir)
        return self._experiment
