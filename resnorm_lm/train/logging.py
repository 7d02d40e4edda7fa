"""A CSVLogger that continues a resumed run's ``metrics.csv`` instead of deleting it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


def rows_up_to_step(path: Path, step: int) -> list[dict[str, Any]]:
    """The rows of a metrics.csv logged at or before ``step`` (later ones belong to the lost tail)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in row.items() if v != ""} for row in rows if float(row.get("step") or 0) <= step]


class ContinuedCSVLogger(CSVLogger):
    """Writes ``<save_dir>/metrics.csv``; on resume from step k, keeps the earlier rows up to k.

    Lightning's CSVLogger deletes an existing metrics.csv; a resumed run should keep
    its history, minus the rows logged after the checkpoint it resumes from.
    """

    def __init__(self, save_dir: str | Path, resume_step: int | None = None) -> None:
        previous = rows_up_to_step(Path(save_dir) / "metrics.csv", resume_step) if resume_step is not None else []
        super().__init__(save_dir=str(save_dir), name="", version="")
        self._previous_rows = previous

    @property
    @rank_zero_experiment  # other ranks get Lightning's dummy experiment, which has every attribute (as a no-op)
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = RunMetricsWriter(log_dir=self.log_dir)
            self._experiment.metrics[:0] = self._previous_rows  # written before any new row, on the first save
            self._previous_rows = []
        return self._experiment


class RunMetricsWriter(ExperimentWriter):
    """Lightning's writer, in a run directory: it replaces the run's metrics.csv (a resumed run's earlier rows
    were read first) without Lightning's warning that the folder "exists and is not empty", which a run directory
    always is (its lock, its manifest, its config)."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            self._fs.rm_file(self.metrics_file_path)
