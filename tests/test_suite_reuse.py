"""``suite --reuse``: another suite's finished runs taken instead of trained twice, only where their config and
their arithmetic are what this suite would train here; each refusal said with what differs."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml

from resnorm_lm.analysis.reuse import OtherArithmetic, config_differences, flatten, reuse_runs
from resnorm_lm.analysis.suite import TunedBudget, load, settle
from resnorm_lm.analysis.sweep import RunSpec
from tests.test_suite import bowl, fake_run, outcomes_for, recipes, suite_file  # noqa: F401 (a fixture)

HERE = {"version": 1, "reference": "r1", "model": "m1"}  # this machine's fingerprints, as fake_run records them


def config_of(spec: RunSpec, root: Path, max_steps: int = 6) -> dict:
    """A run's resolved config as fit writes it (the parts these tests look at)."""
    return {
        "seed_everything": spec.seed,
        "trainer": {"max_steps": max_steps, "enable_progress_bar": False},
        "model": {"arch": {"n_layer": 12}, "optim": {"lr": spec.setting.lr, "warmup_fraction": spec.setting.warmup}},
        "data": {"seed": spec.seed},
        "run": {"root": str(root), "group": "suite-other"},
    }


def the_suites_config(command: list[str]) -> dict:
    """What `fit --print_config` of this suite's command says: options added since (qk_norm) at their defaults,
    its own root and group, the data seed following seed_everything."""
    spec = command[-1]
    return {
        "seed_everything": spec.seed,
        "trainer": {"max_steps": 6, "enable_progress_bar": None},
        "model": {"arch": {"n_layer": 12, "qk_norm": "none"}, "optim": {"lr": 1.0, "warmup_fraction": 1.0}},
        "data": {"seed": None},
        "run": {"root": "runs/suites/suite", "group": "suite-suite", "logger": "csv"},
    }


def trained_elsewhere(root: Path, design: TunedBudget, recipe: str, changed=None, reference="r1") -> list[RunSpec]:
    """Every run ``design`` wants of ``recipe``, finished under ``root`` as another suite left them (on a machine
    whose reference fingerprint is ``reference``)."""
    specs = list(outcomes_for(design, recipe, bowl(0.002)))
    for spec in specs:
        fake_run(root, spec, bowl(0.002)(spec.setting, spec.seed), test=5.2, reference=reference)
        config = config_of(spec, root)
        if changed and changed[0] == spec:
            config["trainer"]["max_steps"] = changed[1]
        (spec.run_dir(str(root), "smoke") / "config.yaml").write_text(yaml.safe_dump(config))
    return specs


def test_the_runs_a_suite_wants_are_taken_where_config_and_arithmetic_match(tmp_path, recipes, capsys):  # noqa: F811
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    specs = trained_elsewhere(tmp_path / "other", design, "a-12l")
    selection = [s for s in specs if s.seed == 0]
    longer, other_code = selection[0], selection[1]
    (other_code.run_dir(str(tmp_path / "other"), "smoke") / "config.yaml").unlink()  # rewritten below, changed
    config = config_of(longer, tmp_path / "other", max_steps=12)
    (longer.run_dir(str(tmp_path / "other"), "smoke") / "config.yaml").write_text(yaml.safe_dump(config))
    manifest = other_code.run_dir(str(tmp_path / "other"), "smoke") / "manifest.json"
    record = json.loads(manifest.read_text())
    record["segments"][0]["arithmetic"]["fingerprint"]["model"] = "m2"  # its code computed other numbers
    manifest.write_text(json.dumps(record))
    (other_code.run_dir(str(tmp_path / "other"), "smoke") / "config.yaml").write_text(
        yaml.safe_dump(config_of(other_code, tmp_path / "other"))
    )
    root = str(tmp_path / "here")
    asked = []

    def fingerprints(recipes_asked):
        asked.append(recipes_asked)
        return {r: HERE for r in recipes_asked}

    take = functools.partial(
        reuse_runs,
        suite,
        functools.partial(settle, design, root, "smoke"),
        root,
        [tmp_path / "other"],
        lambda spec: ["fit", spec],
        fingerprints,
        the_suites_config,
    )
    copied = take()
    out = capsys.readouterr().out
    # the selection grid but the two that differ; the seeds wait for the grid, whose two runs train here
    assert copied == len(selection) - 2 and asked == [["a-12l"]]
    assert "trainer.max_steps: run 12, suite 6" in out and "segment 0 model fingerprint: run 'm2', here 'm1'" in out
    _, outcomes = settle(design, root, "smoke")
    assert {s.recipe for s in outcomes} == {"a-12l"} and longer not in outcomes and other_code not in outcomes
    taken = next(iter(outcomes)).run_dir(root, "smoke")
    assert json.loads((taken / "reused.json").read_text())["from"].startswith(str(tmp_path / "other"))
    assert not (taken / "checkpoints").exists()  # its test split was evaluated: no checkpoint needed here
    for spec in (longer, other_code):  # trained here: the grid is complete, the plan asks for the seeds
        fake_run(tmp_path / "here", spec, bowl(0.002)(spec.setting, spec.seed))
    assert take() == len(specs) - len(selection)  # every fresh seed, found once the grid decided the pick
    assert set(settle(design, root, "smoke")[1]) == set(specs)


def test_a_config_differs_only_where_a_run_computes_something_else():
    want = flatten({"seed_everything": 3, "data": {"seed": None}, "model": {"arch": {"qk_norm": "none"}}})
    have = flatten({"seed_everything": 3, "data": {"seed": 3}, "run": {"root": "elsewhere"}, "ckpt_path": "last"})
    assert config_differences(want, have) == []  # the data seed follows the seed; qk_norm added since; the root;
    # a resumed run's resume point (a resume is exact)
    assert config_differences(want, {**have, "data.seed": 4}) == ["data.seed: run 4, suite None"]
    assert config_differences({**want, "model.arch.qk_norm": "full"}, have) == [
        "model.arch.qk_norm: run '(absent)', suite 'full'"
    ]


def test_runs_trained_on_a_gpu_are_matched_with_the_gpus_fingerprints_not_the_cpus(tmp_path, recipes, monkeypatch):  # noqa: F811
    from resnorm_lm.analysis import reuse

    assert reuse.probe_device([]) == "cpu"
    assert reuse.probe_device(["--trainer.accelerator=gpu", "--trainer.enable_progress_bar=false"]) == "cuda"
    assert reuse.probe_device(["--trainer.accelerator=gpu", "--trainer.accelerator=cpu"]) == "cpu"  # the last wins
    asked = []

    def probe(cmd, **_):
        asked.append(cmd)
        models = {r: f"m-{r}" for r in cmd[cmd.index("--recipes") + 1 :]}
        reply = json.dumps({"version": 1, "reference": "r1", "models": models})
        return type("Done", (), {"returncode": 0, "stdout": reply, "stderr": ""})()

    monkeypatch.setattr(reuse.subprocess, "run", probe)
    suite = load(str(suite_file(tmp_path)))
    got = reuse.machine_fingerprints(suite, ["a-12l"], device="cuda")
    assert got == {"a-12l": {"version": 1, "reference": "r1", "model": "m-a-12l"}}
    assert asked[-1][asked[-1].index("--device") + 1] == "cuda"
    reuse.machine_fingerprints(suite, ["a-12l"])
    assert asked[-1][asked[-1].index("--device") + 1] == "cpu"


def test_runs_of_another_machine_arithmetic_stop_the_suite_rather_than_start_it_again(tmp_path, recipes, capsys):  # noqa: F811
    """Every run offered was trained where the reference fingerprint is r0, this machine's is r1: nothing is
    copied, and the suite stops with whose runs they are, unless asked to start its own table; a suite that already
    has a run of this machine's goes on without asking."""
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    specs = trained_elsewhere(tmp_path / "other", design, "a-12l", reference="r0")
    root = tmp_path / "here"
    take = functools.partial(
        reuse_runs,
        suite,
        functools.partial(settle, design, str(root), "smoke"),
        str(root),
        [tmp_path / "other"],
        lambda spec: ["fit", spec],
        lambda asked: {r: HERE for r in asked},
        the_suites_config,
    )
    with pytest.raises(OtherArithmetic) as err:
        take()
    said = str(err.value)
    assert "reference fingerprint r0, " in said and "this machine's (r1)" in said and "--new-arithmetic" in said
    assert "segment 0 reference fingerprint: run 'r0', here 'r1'" in capsys.readouterr().out  # each refusal, why
    assert not root.exists() and settle(design, str(root), "smoke")[1] == {}
    assert take(new_arithmetic=True) == 0  # asked for: the suite trains here, as a table of its own
    first = next(s for s in specs if s.seed == 0)
    fake_run(root, first, bowl(0.002)(first.setting, first.seed))  # a run of this machine's arithmetic (r1)
    assert take() == 0  # the suite is this machine's already: it goes on, and the r0 runs are not taken
