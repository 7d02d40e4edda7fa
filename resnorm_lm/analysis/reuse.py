"""Runs another suite already trained, taken instead of trained twice: ``resnorm-lm suite <name> --reuse DIR``.

Two suites often want the same runs: ``designs-12l`` trains pre-norm and post-norm on the placements suite's
protocol and budget, so that its differences pair by seed within one table. A run of DIR (another suite's runs
root, or its exported run files) is copied into this suite's root when this suite wants a run of its recipe,
setting and seed, has not finished one, and

* the run finished;
* its resolved config is the one this suite would train it with (``fit --print_config`` of the suite's own
  command), but for where it lives and what it is called (``RELOCATABLE``) and for options added since, at their
  defaults (None, 'none', False);
* every segment's arithmetic fingerprint equals this machine's for its recipe in the suite's arithmetic
  (``python -m resnorm_lm.train.arithmetic --recipes ... --json``): the same machine arithmetic, and the same
  numbers from today's code.

Its small files are copied (and its checkpoints where it has them and its test split is not yet evaluated),
with ``reused.json`` saying where from; its manifest keeps the code revision it trained with, which the table's
provenance lists. The plan is asked again after each round of copies: a finished run decides the next.

Where the runs offered were trained in another machine arithmetic (their reference fingerprint is not this
machine's) and the suite has no finished run in this machine's, training here would start the suite again from
its first run, a table of its own: that stops with ``OtherArithmetic``, saying whose the runs are and how to go
on, unless asked for (``suite --new-arithmetic``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from resnorm_lm.analysis.evidence import segment_arithmetics
from resnorm_lm.analysis.sweep import RunSpec
from resnorm_lm.data.cache import atomic_write
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.runs import RunDir, copy_small_files, working_root

if TYPE_CHECKING:
    from resnorm_lm.analysis.suite import Suite

# where a run lives, what it is called, what only shows it, and where a resumed run resumed from (a resume is exact:
# tests/test_faults.py): not part of what it computes
RELOCATABLE = (
    "run.root",
    "run.group",
    "run.tag",
    "run.logger",
    "trainer.enable_progress_bar",
    "data.cache_dir",
    "ckpt_path",
)
ADDED_AT_DEFAULT = (None, "none", False)  # an option a run's code did not have, at a value that changes nothing


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """What keeps a run's config (``have``, flattened) from being the one expected (``want``, flattened), as
    'key: run X, suite Y'."""
    want = dict(want)
    if want.get("data.seed") is None and have.get("data.seed") == want.get("seed_everything"):
        want["data.seed"] = have.get("data.seed")  # the data order follows seed_everything unless set
    differ = []
    for key in sorted(set(want) | set(have)):
        if key in RELOCATABLE or key.startswith(("trainer.logger", "trainer.callbacks")):
            continue
        if key not in have and want[key] in ADDED_AT_DEFAULT:
            continue  # an option added since the run trained, at the value that keeps its numbers
        if want.get(key, "(absent)") != have.get(key, "(absent)"):
            differ.append(f"{key}: run {have.get(key, '(absent)')!r}, suite {want.get(key, '(absent)')!r}")
    return differ


class OtherArithmetic(ResnormError, RuntimeError):
    """The runs offered for reuse were trained in another machine arithmetic than this machine's."""


def fingerprint_differences(run_dir: Path, current: dict[str, Any]) -> list[str]:
    """What keeps a run's arithmetic (every segment's fingerprint) from being this machine's for its recipe."""
    manifest = RunDir(run_dir).manifest()
    segments = manifest.get("segments") or [manifest]
    differ = []
    for i, segment in enumerate(segments):
        recorded = (segment.get("arithmetic") or {}).get("fingerprint") or {}
        for key in ("version", "reference", "model"):
            if recorded.get(key) != current.get(key):
                differ.append(f"segment {i} {key} fingerprint: run {recorded.get(key)!r}, here {current.get(key)!r}")
    return differ


def probe_device(machine: list[str]) -> str:
    """Where a suite's runs compute, from its machine overrides: 'cuda' with ``--trainer.accelerator=gpu``
    (or cuda), else 'cpu'."""
    accelerators = [arg.split("=", 1)[1] for arg in machine if arg.startswith("--trainer.accelerator=")]
    return "cuda" if accelerators and accelerators[-1] in ("gpu", "cuda") else "cpu"


def machine_fingerprints(suite: Suite, recipes: list[str], device: str = "cpu") -> dict[str, dict[str, Any]]:
    """This machine's fingerprint for each recipe, in the suite's arithmetic, on ``device``."""
    probe = arithmetic_probe(suite, recipes, device)
    return {
        r: {"version": probe["version"], "reference": probe["reference"], "model": probe["models"][r]} for r in recipes
    }


def arithmetic_probe(
    suite: Suite, recipes: list[str], device: str = "cpu", env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``python -m resnorm_lm.train.arithmetic --json`` at the suite's profile, in its arithmetic over ``env``
    (this process's by default), on ``device``: the reference fingerprint and each recipe's model fingerprint (a
    process of its own: the kernel caps are read when the libraries load)."""
    env = suite.environment(os.environ if env is None else env)
    cmd = [sys.executable, "-m", "resnorm_lm.train.arithmetic", "--profile", suite.profile, "--json"]
    cmd += ["--device", device]
    done = subprocess.run([*cmd, "--recipes", *recipes], cwd=working_root(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the arithmetic probe failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def printed_config(command: list[str]) -> dict[str, Any]:
    """The config a ``fit`` command would train with (LightningCLI's ``--print_config``), without training."""
    done = subprocess.run([*command, "--print_config"], cwd=working_root(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"fit --print_config failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return yaml.safe_load(done.stdout)


def reuse_runs(
    suite: Suite,
    settle: Callable[[], tuple[list[RunSpec], dict[RunSpec, Any]]],
    root: str,
    sources: list[str | Path],
    command: Callable[[RunSpec], list[str]],
    fingerprints: Callable[[list[str]], dict[str, dict[str, Any]]] | None = None,
    expected_config: Callable[[list[str]], dict[str, Any]] = printed_config,
    new_arithmetic: bool = False,
) -> int:
    """Copy into ``root`` every run of ``sources`` this suite wants and may take (the module's docstring), asking
    ``settle`` (the plan and the finished runs) again after each round; say what was taken and why the rest were
    not; the number of runs copied. ``command``: the suite's ``fit`` command of a run. Raises ``OtherArithmetic``
    where runs offered are of another machine arithmetic and, after the copies, none of the suite's finished runs
    is this machine's, unless ``new_arithmetic``."""
    fingerprints = fingerprints or (lambda recipes: machine_fingerprints(suite, recipes))
    sources = [Path(s) for s in sources]
    current: dict[str, dict[str, Any]] = {}  # this machine's fingerprints, by recipe
    configs: dict[str, dict[str, Any]] = {}  # the config the suite trains a recipe with (flattened), by recipe
    copied, refused = 0, {}
    elsewhere: dict[str, set[str]] = {}  # another machine arithmetic's reference -> the sources' run dirs of it
    while True:
        plan, outcomes = settle()
        candidates = []
        for spec in (s for s in plan if s not in outcomes and s not in refused):
            dirs = (spec.run_dir(str(s), suite.profile) for s in sources)
            found = next((d for d in dirs if RunDir(d).summary().get("finished")), None)
            if found is not None:
                candidates.append((spec, found))
        if not candidates:
            break
        missing = sorted({spec.recipe for spec, _ in candidates} - set(current))
        if missing:
            current.update(fingerprints(missing))
        for spec, source in candidates:
            if spec.recipe not in configs:
                configs[spec.recipe] = flatten(expected_config(command(spec)))
            want = {**configs[spec.recipe], "seed_everything": spec.seed}
            want.update(
                {
                    k: v
                    for k, v in (
                        ("model.optim.lr", spec.setting.lr),
                        ("model.optim.warmup_fraction", spec.setting.warmup),
                    )
                    if v is not None
                }
            )
            here = current[spec.recipe]["reference"]
            for reference in segment_arithmetics(source) - {here}:
                elsewhere.setdefault(reference, set()).add(str(source))
            differ = fingerprint_differences(source, current[spec.recipe])
            differ += config_differences(want, flatten(RunDir(source).config()))
            if differ:
                refused[spec] = differ
                continue
            take(source, spec.run_dir(root, suite.profile))
            copied += 1
    for spec, differ in refused.items():
        print(
            f"suite {suite.name}: not reused (it trains here): {spec.run_dir('', suite.profile)}: {'; '.join(differ)}"
        )
    print(f"suite {suite.name}: {copied} finished run(s) reused from {', '.join(map(str, sources))}", flush=True)
    if elsewhere and not new_arithmetic:
        here = next(iter(current.values()))["reference"]
        _, outcomes = settle()
        if not any(here in segment_arithmetics(spec.run_dir(root, suite.profile)) for spec in outcomes):
            raise OtherArithmetic(other_arithmetic_message(suite.name, here, elsewhere))
    return copied


def other_arithmetic_message(name: str, here: str, elsewhere: dict[str, set[str]]) -> str:
    """Why a suite does not start again here, whose its runs are and the two ways on."""
    theirs = ", ".join(f"{reference}, {len(runs)} run(s) offered" for reference, runs in sorted(elsewhere.items()))
    return (
        f"the runs --reuse offers to suite {name} were trained in another machine arithmetic (reference "
        f"fingerprint {theirs}) than this machine's ({here}), and none of the suite's finished runs is this "
        "machine's: training here would start the suite again from its first run, as a table of its own. Continue "
        f"it on a machine whose `python -m resnorm_lm.train.arithmetic --portable` prints {min(elsewhere)}, or "
        "start this machine's own table on purpose with --new-arithmetic (and a --root and --export of its own)"
    )


def take(source: Path, target: Path) -> None:
    """A run's small files (and checkpoints, where its test split is not yet evaluated) into ``target``, which
    then says where they came from."""
    copy_small_files([source], source.parent, target.parent)
    if "test" not in (RunDir(source).summary().get("eval") or {}) and (source / "checkpoints").is_dir():
        shutil.copytree(source / "checkpoints", target / "checkpoints", dirs_exist_ok=True)
    with atomic_write(target / "reused.json", "w") as f:
        json.dump({"from": str(source.resolve()), "at": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
