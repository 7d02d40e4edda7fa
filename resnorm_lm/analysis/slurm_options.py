"""What each SLURM job of a ``compare --launcher slurm`` sweep asks for, and how compare paces the jobs: the
site's defaults from a config file, then compare's ``--slurm-*`` options on top.

The file is YAML; every key is optional and an unknown key fails::

    partition: gpu              # --partition (none: the cluster's default)
    account: mylab              # --account
    time: "04:00:00"            # --time of each job, in quotes: minutes, [days-]hours:minutes:seconds, ...
    gpus_per_run: 1             # --gres=gpu:G, one task per GPU (none: 1 where the profile trains on a GPU)
    cpus_per_run: 8             # --cpus-per-task, over the run's tasks
    max_jobs: 100               # the most of the sweep's jobs queued or running at once
    poll_seconds: 30            # how often compare asks squeue while it waits
    sbatch_args: ["--qos=normal", "--mem=64G"]   # anything else the site needs

It is read from ``--slurm-config``, else from $RESNORM_LM_SLURM_CONFIG, else from
~/.config/resnorm-lm/slurm.yaml ($XDG_CONFIG_HOME/resnorm-lm/slurm.yaml) where that exists.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_ENV = "RESNORM_LM_SLURM_CONFIG"
# sbatch --time's formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]]
TIME_FORMAT = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2}|UNLIMITED|INFINITE)$")


@dataclass(frozen=True)
class SlurmOptions:
    """A sweep's SLURM settings: what each run's job asks for, and how many jobs compare keeps in the queue."""

    partition: str | None = None  # --partition; None: the cluster's default partition
    account: str | None = None  # --account, where the site bills by account
    time: str | None = None  # --time of each job, e.g. "04:00:00" or "1-00:00:00"; None: the partition's default
    gpus_per_run: int | None = None  # --gres=gpu:G, one task per GPU; None: 1 where the profile trains on a GPU
    cpus_per_run: int | None = None  # CPUs of one run, shared by its tasks (--cpus-per-task); None: SLURM's default
    max_jobs: int = 100  # the most of the sweep's jobs queued or running at once
    poll_seconds: float = 30.0  # how often compare asks squeue while it waits
    sbatch_args: tuple[str, ...] = ()  # further sbatch options, as the site needs them

    def __post_init__(self) -> None:
        for name in ("partition", "account", "time"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"slurm {name} must be a non-empty string, got {value!r}")
        if self.time is not None and not TIME_FORMAT.match(self.time):
            raise ValueError(
                f"slurm time {self.time!r} is none of sbatch's formats: minutes, hours:minutes:seconds, "
                "days-hours:minutes:seconds (e.g. 04:00:00, 1-00:00:00)"
            )
        for name, minimum in (("gpus_per_run", 0), ("cpus_per_run", 1), ("max_jobs", 1)):
            value = getattr(self, name)
            optional = name != "max_jobs"
            if (value is None and optional) or (type(value) is int and value >= minimum):
                continue
            raise ValueError(f"slurm {name} must be an integer >= {minimum}, got {value!r}")
        if (
            isinstance(self.poll_seconds, bool)
            or not isinstance(self.poll_seconds, int | float)
            or not self.poll_seconds > 0
        ):
            raise ValueError(f"slurm poll_seconds must be a number > 0, got {self.poll_seconds!r}")
        if not all(isinstance(arg, str) and arg.startswith("-") for arg in self.sbatch_args):
            raise ValueError(
                f"slurm sbatch_args must be sbatch options such as '--qos=normal', got {list(self.sbatch_args)!r}"
            )

    @classmethod
    def load(cls, path: str | None = None, **given: Any) -> SlurmOptions:
        """The config file's settings (``path``, else ``config_path()``), then the ``given`` ones that are not
        None (compare's command line)."""
        file = Path(path) if path else config_path()
        settings = read_config(file) if file is not None else {}
        settings.update({name: value for name, value in given.items() if value is not None})
        return cls(**settings)

    def sbatch_options(self, gpus: int) -> list[str]:
        """sbatch's options for one run on ``gpus`` GPUs (0: the CPU), one task per GPU."""
        tasks = max(gpus, 1)
        options = [f"--ntasks-per-node={tasks}"] + ([f"--gres=gpu:{gpus}"] if gpus else [])
        if self.cpus_per_run is not None:
            options.append(f"--cpus-per-task={self.cpus_per_task(gpus)}")
        for name in ("partition", "account", "time"):
            if getattr(self, name) is not None:
                options.append(f"--{name}={getattr(self, name)}")
        return options + list(self.sbatch_args)

    def cpus_per_task(self, gpus: int) -> int | None:
        """The CPUs of each of a run's tasks (one per GPU): ``cpus_per_run`` shared out, at least 1."""
        return None if self.cpus_per_run is None else max(1, self.cpus_per_run // max(gpus, 1))


def config_path() -> Path | None:
    """Where the site's config is when ``--slurm-config`` names none: $RESNORM_LM_SLURM_CONFIG, else
    ~/.config/resnorm-lm/slurm.yaml where it exists, else none."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = home / "resnorm-lm" / "slurm.yaml"
    return path if path.is_file() else None


def read_config(path: Path) -> dict[str, Any]:
    """The settings of a config file (``yaml.safe_load``: a config is data); unknown keys fail with the valid ones."""
    import yaml

    if not path.is_file():
        raise ValueError(f"no SLURM config file at {path}")
    settings = yaml.safe_load(path.read_text()) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: a SLURM config is a mapping of settings, got {type(settings).__name__}")
    valid = [field.name for field in dataclasses.fields(SlurmOptions)]
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    if isinstance(settings.get("time"), int | float):  # YAML reads 4:00:00 as a number (of seconds, base 60)
        raise ValueError(f'{path}: write the time limit in quotes, e.g. time: "04:00:00", got {settings["time"]!r}')
    if isinstance(settings.get("sbatch_args"), list):
        settings["sbatch_args"] = tuple(settings["sbatch_args"])
    return settings
