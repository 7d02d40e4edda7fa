"""Suites: the pre-registered file, the budget algorithm (the same runs for every recipe wherever its pick lands),
the seed pilot's design, the table's rule for stuck seeds and its paired intervals, the provenance check, and a
tiny suite trained, interrupted and resumed without training a finished run twice."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from resnorm_lm.analysis.evidence import ProvenanceError, table_provenance
from resnorm_lm.analysis.suite import (
    SUITE_DESIGNS,
    SeedPilot,
    SuiteError,
    SuiteTrainer,
    TunedBudget,
    available_suites,
    load,
    machine_overrides,
    main,
    suite_path,
)
from resnorm_lm.analysis.suite_report import TunedReport, tuned_markdown
from resnorm_lm.analysis.sweep import RunOutcome, RunSpec, Setting
from tests.smoke import REPO, run_cli_captured, write_learnable_corpus

LRS = [0.001, 0.002, 0.004, 0.008]
UNIGRAM = 6.4


def suite_file(tmp_path: Path, **changes) -> Path:
    raw = {
        "about": "a test suite",
        "design": "tuned",
        "profile": "smoke",
        "recipes": ["a-12l", "b-12l"],
        "reference": "a-12l",
        "train": {"trainer.max_steps": 6},
        "budget": {
            "lrs": LRS,
            "warmups": [0.1, 0.3],
            "selection_seed": 0,
            "extensions": 2,
            "seeds": [1, 2, 3, 4, 5],
            "runner_up_seeds": [1, 2],
        },
    }
    raw.update(changes)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    return path


@pytest.fixture
def recipes(monkeypatch, tmp_path):
    """Two recipes named a-12l and b-12l (the repository's prenorm and postnorm), wherever a suite looks."""
    from resnorm_lm.analysis import suite as suite_file

    real = suite_file.recipe_path
    names = {"a-12l": "prenorm-12l", "b-12l": "postnorm-12l"}
    monkeypatch.setattr(suite_file, "recipe_path", lambda name: real(names.get(name, name)))


def outcomes_for(design: TunedBudget, recipe: str, loss_at, seeds=None) -> dict[RunSpec, RunOutcome]:
    """Every run ``design`` plans for ``recipe``, finished, each scoring ``loss_at(setting, seed)`` (None:
    diverged): the plan asked again after each round until it stops growing, as the runner does."""
    done: dict[RunSpec, RunOutcome] = {}
    while True:
        new = [s for s in design.plan(done) if s.recipe == recipe and s not in done]
        if not new:
            return done
        for spec in new:
            loss = loss_at(spec.setting, spec.seed)
            done[spec] = RunOutcome(spec, loss, diverged=loss is None)


def bowl(best_lr: float, best_warmup: float = 0.3):
    return lambda s, seed: (
        5.0 + 0.1 * math.log2(s.lr / best_lr) ** 2 + (0 if s.warmup == best_warmup else 0.05) + 0.001 * seed
    )


def test_every_suite_in_the_repository_loads(recipes):
    assert {"placements-12l", "pilot-seeds"} <= set(available_suites())
    placements = load("placements-12l")
    assert placements.reference == "prenorm-12l" and placements.recipes[0] == "prenorm-12l"
    assert len(placements.recipes) == 10 and TunedBudget(placements).max_runs == 21
    assert "--trainer.precision=32-true" in placements.train_args() and placements.arithmetic == "portable"
    pilot = load("pilot-seeds")
    assert SeedPilot(pilot).max_runs == 13 and len(SeedPilot(pilot).plan({})) == 26
    for name in available_suites():  # every file, recipes and all, as `make suite SUITE=<name>` reads it
        if "recipes_of" in suite_path(name).read_text():  # drawn from a table: loads once that table is complete
            try:
                assert load(name).drawn_by is not None
            except SuiteError as err:
                assert "is not complete" in str(err) and "waiting for" in str(err), err
            continue
        assert load(name).name == name


def test_designs_dyt_part_is_designs_12l_itself_on_fewer_recipes(recipes):
    """Its runs are runs designs-12l wants, so that designs-12l takes them (--reuse) rather than training twice."""
    part, whole = load("designs-12l-dyt"), load("designs-12l")
    assert set(part.recipes) < set(whole.recipes) and part.reference == whole.reference in part.recipes
    assert {r for r in part.recipes if "dyt" in r} == {r for r in whole.recipes if "dyt" in r} != set()
    same = ("design", "profile", "train", "arithmetic", "sections")
    assert [getattr(part, k) for k in same] == [getattr(whole, k) for k in same]
    assert TunedBudget(part).plan({})[0] in TunedBudget(whole).plan({})


def test_the_second_horizons_in_the_repository_are_placements_at_2000_steps():
    base = load("placements-12l")
    for name in ("placements-12l-2000", "placements-12l-2000-all"):
        long = load(name)  # the loader checks that nothing but trainer.max_steps differs
        assert long.horizon_of == "placements-12l" and long.max_steps == 2000 and set(long.recipes) <= set(base.recipes)
    assert load("placements-12l-2000-all").recipes == base.recipes


def horizon_file(tmp_path: Path, **changes) -> Path:
    """suite.yaml (suite_file's, 6 steps) and long.yaml, its second horizon at 12 steps unless ``changes``."""
    raw = yaml.safe_load(suite_file(tmp_path).read_text())
    raw.update({"horizon_of": "suite", "train": {"trainer.max_steps": 12}}, **changes)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def table_csv(path: Path, rows: list[tuple[str, float | None, str]]) -> Path:
    """A suite's table.csv with the columns a drawing rule reads: (recipe, mean validation loss, status)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["recipe", "runs", "val_loss_mean", "status"])
        w.writerows((r, 19, "" if v is None else v, st) for r, v, st in rows)
    return path


def test_a_suite_draws_its_recipes_from_a_complete_table_by_the_rule_its_file_wrote(tmp_path, recipes):
    from resnorm_lm.analysis.suite_report import drawn_line

    table = tmp_path / "base" / "table.csv"
    rows = [
        ("mixln-12l", 5.096, "complete"),
        ("lns-12l", 5.017, "complete"),
        ("noresidual-12l", None, "complete"),  # every fresh seed failed: no loss, not ranked
        ("a-12l", 5.032, "complete"),
        ("rezero-12l", 5.028, "complete"),
        ("deepnorm-12l", None, "diverged at every setting"),
        ("sandwich-12l", 5.287, "complete"),
        ("b-12l", 5.218, "complete"),
    ]
    table_csv(table, rows)
    rule = {"table": str(table), "best": 3, "with": ["a-12l", "b-12l"]}
    path = suite_file(tmp_path, recipes=None, recipes_of=rule)
    suite = load(str(path))
    assert suite.recipes == ["a-12l", "lns-12l", "rezero-12l", "b-12l"]  # the reference first; a-12l ranked third
    said = drawn_line(suite.drawn_by)
    assert suite.drawn_by.best == 3 and f"`{table}`" in said and "3 best by validation loss" in said
    table_csv(table, [*rows[:-1], ("b-12l", None, "partial: 3/5 fresh seeds")])
    with pytest.raises(SuiteError, match=r"is not complete \(7 of 8 rows final; waiting for b-12l\)"):
        load(str(path))


@pytest.mark.parametrize(
    "change, said",
    [
        ({"recipes_of": {"table": "t.csv", "best": 2}}, "give `recipes`"),  # both keys
        ({"recipes": None, "recipes_of": {"table": "t.csv"}}, "recipes_of: {table:"),
        ({"recipes": None, "recipes_of": {"table": "t.csv", "best": 0}}, "best: a count of 1 or more"),
        ({"recipes": None, "recipes_of": {"table": "no/such.csv", "best": 2}}, "no table at no/such.csv"),
    ],
)
def test_a_drawing_rule_that_cannot_draw_is_refused_with_what_to_write(tmp_path, recipes, change, said):
    with pytest.raises(SuiteError, match=re.escape(said)):
        load(str(suite_file(tmp_path, **change)))


@pytest.mark.parametrize(
    "change, said",
    [
        ({"train": {"trainer.max_steps": 6}}, "trainer.max_steps must differ from suite's (6)"),
        ({"train": {"trainer.max_steps": 12, "trainer.gradient_clip_val": 1.0}}, "train differs beyond"),
        ({"profile": "cpu"}, "its profile differs (cpu against smoke)"),
        ({"recipes": ["a-12l", "sandwich-12l"]}, "sandwich-12l not in suite"),
        ({"horizon_of": "long"}, "horizon_of: a suite cannot name itself"),
        ({"horizon_of": "nope"}, "unknown suite 'nope'"),
    ],
)
def test_a_second_horizon_that_changes_more_than_max_steps_is_refused(tmp_path, recipes, change, said):
    assert load(str(horizon_file(tmp_path))).horizon_of == "suite"  # as written: accepted
    with pytest.raises(SuiteError) as err:
        load(str(horizon_file(tmp_path, **change)))
    assert said in str(err.value)


def test_a_second_horizon_may_narrow_each_recipes_grid_and_nothing_else(tmp_path, recipes, monkeypatch):
    """tuned-around: each recipe tunes on its own grid (of one length and spacing), the rest of the budget as the
    first horizon's, and its table says each grid; a grid of another spacing, a recipe left out or a seed changed is
    refused, and said."""
    from resnorm_lm.analysis import suite as suite_module

    monkeypatch.setattr(suite_module, "unigram_reference", lambda run_dir: UNIGRAM)
    budget = yaml.safe_load(suite_file(tmp_path).read_text())["budget"]
    around = {"a-12l": [0.001, 0.002, 0.004], "b-12l": [0.004, 0.008, 0.016]}
    long = load(str(horizon_file(tmp_path, design="tuned-around", budget={**budget, "lrs": around})))
    design = SUITE_DESIGNS.get(long.design)(long)
    assert design.max_runs == 3 * 2 + 2 + 5 + 2
    for recipe, lrs in around.items():
        grid = [s.setting for s in design.plan({}) if s.recipe == recipe]
        assert grid == [Setting(lr, w) for w in (0.1, 0.3) for lr in lrs]
    # a pick at its grid's top edge extends beyond it by the grid's own factor, as tuned does
    done = outcomes_for(design, "b-12l", bowl(0.05))
    assert {Setting(0.032, 0.3), Setting(0.064, 0.3)} <= {s.setting for s in done}
    assert "LRs per recipe (a-12l 0.001, 0.002, 0.004; b-12l 0.004, 0.008, 0.016)" == design.grid_text()
    for spec in [*outcomes_for(design, "a-12l", bowl(0.002)), *done]:
        fake_run(tmp_path / "long", spec, bowl(0.002 if spec.recipe == "a-12l" else 0.05)(spec.setting, spec.seed))
    results = tmp_path / "results"
    assert (
        main([str(tmp_path / "long.yaml"), "--root", str(tmp_path / "long"), "--no-train", "--results", str(results)])
        == 0
    )
    table = (results / "long" / "long.md").read_text()
    assert "Budget: LRs per recipe (a-12l 0.001, 0.002, 0.004; b-12l 0.004, 0.008, 0.016) x warmup fractions" in table
    b = next(row for row in csv.DictReader((results / "long" / "table.csv").open()) if row["recipe"] == "b-12l")
    assert (float(b["lr"]), b["lr_edge"], b["runs"]) == (0.064, "highest", "15")  # two extensions, still at the edge
    refused = [
        ({"lrs": LRS}, "one list per recipe, a mapping with exactly a-12l, b-12l"),
        ({"lrs": {"a-12l": [0.001, 0.002, 0.004]}}, "one list per recipe"),
        ({"lrs": {**around, "b-12l": [0.004, 0.016, 0.064]}}, "the same length and spacing"),
        ({"lrs": {**around, "b-12l": [0.004, 0.008]}}, "budget.lrs.b-12l: at least three learning rates"),
        ({"lrs": around, "seeds": [1, 2, 3]}, "its sections differ"),
    ]
    for change, said in refused:
        with pytest.raises(SuiteError) as err:
            load(str(horizon_file(tmp_path, design="tuned-around", budget={**budget, **change})))
        assert said in str(err.value), (change, str(err.value))


def test_the_cpus_second_horizon_narrows_each_grid_to_its_500_step_pick_and_neighbours():
    """placements-12l-2000's rule (its header): each recipe's LRs are its pick's LR in placements-12l's committed
    table and the 500-step grid's LRs on either side of it."""
    base, long = load("placements-12l"), load("placements-12l-2000")
    grid = SUITE_DESIGNS.get(base.design)(base).lrs
    with (REPO / "docs/results/suites/placements-12l/table.csv").open(newline="") as f:
        picks = {row["recipe"]: float(row["lr"]) for row in csv.DictReader(f) if row["status"] == "complete"}
    design = SUITE_DESIGNS.get(long.design)(long)
    for recipe in long.recipes:
        i = grid.index(picks[recipe])
        assert design.lrs_of(recipe) == grid[i - 1 : i + 2], recipe


def test_a_second_horizon_says_which_verdicts_change(tmp_path, recipes, monkeypatch, capsys):
    """b is 0.1 nats behind a at 6 steps in every seed (behind); at 12 steps the seeds disagree about the sign
    (a tie): horizons.md says the verdict changed, with both intervals, and draws both in one forest plot."""
    from resnorm_lm.analysis import suite as suite_module

    monkeypatch.setattr(suite_module, "unigram_reference", lambda run_dir: UNIGRAM)
    long_path = horizon_file(tmp_path)
    results = tmp_path / "results"
    later = {1: 0.02, 2: -0.03, 3: 0.01, 4: -0.01, 5: 0.0}  # b minus a, seed by seed, at 12 steps
    for path, root, b_minus_a in ((tmp_path / "suite.yaml", "short", lambda k: 0.1), (long_path, "long", later.get)):
        design = TunedBudget(load(str(path)))
        for recipe in ("a-12l", "b-12l"):
            for spec in outcomes_for(design, recipe, bowl(0.002)):
                val = bowl(0.002)(spec.setting, spec.seed) + (b_minus_a(spec.seed) or 0 if recipe == "b-12l" else 0)
                fake_run(tmp_path / root, spec, val, test=val + 0.2)
    args = ["--no-train", "--results", str(results)]
    assert main([str(long_path), "--root", str(tmp_path / "nowhere"), *args]) == 1
    assert "no finished runs of long under" in capsys.readouterr().err and not results.exists()
    assert main([str(long_path), "--root", str(tmp_path / "long"), *args]) == 0  # before the short table exists
    assert "render it first (make suite SUITE=suite ARGS=--no-train)" in capsys.readouterr().out
    assert not (results / "long" / "horizons.md").exists()
    assert main([str(tmp_path / "suite.yaml"), "--root", str(tmp_path / "short"), *args]) == 0
    assert main([str(long_path), "--root", str(tmp_path / "long"), *args]) == 0
    markdown = (results / "long" / "horizons.md").read_text()
    assert "| `a-12l` | 0.002 / 0.3 |" in markdown and "| reference | 0.002 / 0.3 |" in markdown
    assert "- suite (6 steps): arithmetic r1 (v1): 30 runs on CPU X" in markdown  # each table's provenance
    assert "- long (12 steps): arithmetic r1 (v1): 30 runs on CPU X" in markdown
    b = next(line for line in markdown.splitlines() if line.startswith("| `b-12l`"))
    assert "| +0.100 ± 0.000 | behind |" in b and "| -0.002 ± 0.024 | tie | yes |" in b  # t(0.975, 4) 0.0192 / sqrt(5)
    rows = list(csv.DictReader((results / "long" / "horizons.csv").open()))
    assert [(r["recipe"], r["verdict_short"], r["verdict_long"], r["changed"]) for r in rows] == [
        ("a-12l", "reference", "reference", "-"),
        ("b-12l", "behind", "tie", "yes"),
    ]
    assert (results / "long" / "horizons.png").stat().st_size > 0
    (results / "long" / "horizons.md").write_text("stale")  # the shorter horizon's render writes it again
    assert main([str(tmp_path / "suite.yaml"), "--root", str(tmp_path / "short"), *args]) == 0
    assert (results / "long" / "horizons.md").read_text() == markdown  # from long's table.csv, byte for byte


@pytest.mark.parametrize(
    "change, said",
    [
        ({"budgets": {}}, "unknown key(s) budgets; a suite file has: about"),
        ({"profile": None}, "`profile` is missing"),
        ({"recipes": ["a-12l", "nothing-12l"]}, "unknown recipe 'nothing-12l'"),
        ({"reference": "c-12l"}, "reference 'c-12l' is not one of its recipes"),
        ({"design": "random"}, "unknown suite design 'random'; valid suite designs: seeds, tuned"),
        ({"train": {"model.optim.lr": 0.1}}, "model.optim.lr is set by the design for each run"),
        ({"arithmetic": "fast"}, "arithmetic 'fast': one of portable, native"),
        (
            {"budget": {"lrs": LRS, "warmups": [0.1], "seeds": [0, 1], "runner_up_seeds": [1]}},
            "the selection seed 0 must not be one of the fresh seeds",
        ),
        ({"budget": {"lrs": LRS, "warmups": [1.5], "seeds": [1], "runner_up_seeds": [1]}}, "fractions of the run"),
        ({"budget": {"lrs": LRS, "warmups": [0.1], "seeds": [1], "runner_up_seeds": [2]}}, "a subset of budget.seeds"),
        ({"budget": {"lrs": [1e-3, 2e-3], "warmups": [0.1], "seeds": [1], "runner_up_seeds": [1]}}, "at least three"),
    ],
)
def test_a_malformed_suite_file_is_refused_with_what_to_write(tmp_path, recipes, change, said):
    with pytest.raises(SuiteError) as err:
        load(str(suite_file(tmp_path, **change)))
    assert said in str(err.value)
    with pytest.raises(SuiteError, match="unknown suite 'nope'; available suites: .*placements-12l"):
        load("nope")


def test_train_args_reach_every_runs_command_after_the_suite_files_own(tmp_path):
    suite = load("placements-12l")
    machine = machine_overrides(suite, "--trainer.accelerator=gpu --trainer.enable_progress_bar=false")
    trainer = SuiteTrainer(suite, str(tmp_path), jobs=1, machine=machine)
    cmd = trainer.command(RunSpec("prenorm-12l", Setting(1e-3, 0.25), 1), resume=False)
    at = cmd.index("--trainer.accelerator=gpu")
    assert cmd[at : at + 2] == machine and cmd.index("--trainer.max_steps=500") < at
    assert machine_overrides(suite, "--data.corpus=text --data.files=[a/*.txt]") == [
        "--data.corpus=text",
        "--data.files=[a/*.txt]",
    ]


def test_every_run_and_the_test_split_compute_in_the_suites_arithmetic(tmp_path, monkeypatch):
    from resnorm_lm.train.arithmetic import PORTABLE_ENV

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # the machine's own setting, overridden
    suite = load("placements-12l")
    env = SuiteTrainer(suite, str(tmp_path), jobs=2).environment(slot=1)
    assert {k: env.get(k) for k in PORTABLE_ENV} == PORTABLE_ENV and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    suite.arithmetic = "native"
    assert SuiteTrainer(suite, str(tmp_path), jobs=2).environment(slot=1)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_AMX"


@pytest.mark.parametrize(
    "override, said",
    [
        ("--trainer.max_steps=50", "trainer.max_steps is the protocol's (/"),  # the file's path, then its section
        ("--trainer.gradient_clip_val 0.5", "placements-12l.yaml's train: section fixes it"),
        ("--model.optim.lr=0.1", "model is the protocol's (every suite fixes it)"),
        ("--data.seed=3", "data.seed is the protocol's (every suite fixes it)"),
        ("--seed_everything=3", "seed_everything is the protocol's (every suite fixes it)"),
        ("--trainer={precision:bf16-mixed}", "trainer.max_steps is the protocol's"),  # a whole group: each key
        ("--run.root=elsewhere", "suite sets run.root for each run itself"),
    ],
)
def test_train_args_that_would_change_the_protocol_are_refused(tmp_path, capsys, override, said):
    args = ["placements-12l", "--root", str(tmp_path), f"--train-args=--trainer.accelerator=gpu {override}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert said in err and "leave it out" in err and not any(tmp_path.iterdir())  # refused before any run


def test_the_budget_spends_the_same_runs_on_recipes_whose_picks_land_in_different_places(tmp_path, recipes):
    design = TunedBudget(load(str(suite_file(tmp_path))))
    low, high = outcomes_for(design, "a-12l", bowl(0.002)), outcomes_for(design, "b-12l", bowl(0.004, 0.1))
    assert len(low) == len(high) == 8 + 5 + 2  # the grid, five fresh seeds, two at the runner-up
    a, b = design.select("a-12l", low)[0], design.select("b-12l", high)[0]
    assert (a.pick, b.pick) == (Setting(0.002, 0.3), Setting(0.004, 0.1)) and a.lr_edge is b.lr_edge is None
    assert a.runner_up == Setting(0.002, 0.1)  # the other warmup costs 0.05, a factor 2 in LR 0.1
    assert {s.seed for s in low if s.setting == a.pick} == {0, 1, 2, 3, 4, 5}  # selection seed 0, then fresh ones


def test_the_test_split_is_wanted_for_each_fresh_seed_at_a_pick_as_it_finishes(tmp_path, recipes):
    design = TunedBudget(load(str(suite_file(tmp_path))))
    done = {**outcomes_for(design, "a-12l", bowl(0.002)), **outcomes_for(design, "b-12l", bowl(0.004, 0.1))}
    picks = [RunSpec("a-12l", Setting(0.002, 0.3), k) for k in range(1, 6)]
    b_picks = [RunSpec("b-12l", Setting(0.004, 0.1), k) for k in range(1, 6)]
    assert design.tested(done) == [*picks, *b_picks]
    del done[picks[2]]  # a-12l's third fresh seed not finished: its other four are wanted now, not at the end
    assert design.tested(done) == [*picks[:2], *picks[3:], *b_picks]
    grid_only = {s: o for s, o in done.items() if s.seed == 0}
    assert design.tested(grid_only) == []  # picks made, no fresh seed finished
    runner_up = {s: o for s, o in done.items() if s.seed == 0 or s.setting != Setting(0.002, 0.3)}
    assert RunSpec("a-12l", Setting(0.002, 0.1), 1) in runner_up  # the runner-up's seeds: never tested
    assert [s.recipe for s in design.tested(runner_up)] == ["b-12l"] * 5
    unfinished_grid = {s: o for s, o in done.items() if s != RunSpec("a-12l", Setting(0.004, 0.3), 0)}
    assert [s.recipe for s in design.tested(unfinished_grid)] == ["b-12l"] * 5  # a-12l's pick not final yet


def test_the_runner_evaluates_the_test_split_while_it_trains(tmp_path, recipes, monkeypatch):
    """A pick's test split is evaluated on each fresh seed as soon as it has finished, before the runner ends: a
    machine's checkpoints go with the machine, and the table's render may not come in a stopped chunk."""
    from resnorm_lm.analysis import suite_runner

    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    scores = {**outcomes_for(design, "a-12l", bowl(0.002)), **outcomes_for(design, "b-12l", bowl(0.004, 0.1))}
    root = tmp_path / "runs"
    trained, tested = [], []

    def fake_train(self, spec, slot):  # a finished run: eval.json and a checkpoint, as fit leaves them
        run = Path(spec.run_dir(str(root), suite.profile))
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "last.ckpt").write_bytes(b"w")
        (run / "eval.json").write_text(json.dumps({"finished": True, "val_loss": scores[spec].val_loss}))
        trained.append(spec)
        return 0

    def fake_evaluate(suite_, run_dirs):
        tested.append((len(trained), sorted(Path(d).parent.name for d in run_dirs)))

    monkeypatch.setattr(suite_runner.SuiteTrainer, "train", fake_train)
    monkeypatch.setattr(suite_runner.SuiteTrainer, "prepare_data", lambda self, specs: None)
    monkeypatch.setattr(suite_runner, "evaluate_test", fake_evaluate)
    assert suite_runner.train_suite(suite, design, str(root), jobs=1) == set()
    assert set(trained) == set(scores)
    first = next(i for i, (_, recipes_) in enumerate(tested) if recipes_)  # the first call with runs to test
    assert tested[first][1] == ["a-12l"] and tested[first][0] < len(trained)  # its first fresh seed, at once
    assert tested[-1] == (len(trained), ["a-12l"] * 5 + ["b-12l"] * 5)


def test_the_runner_exports_each_run_as_it_finishes(tmp_path, recipes, monkeypatch):
    """--export copies a finished run's small files while the suite still trains (a machine lost between sessions
    takes only the runs in flight), again once its test split is in, and never a checkpoint."""
    from resnorm_lm.analysis import suite_runner

    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    scores = {**outcomes_for(design, "a-12l", bowl(0.002)), **outcomes_for(design, "b-12l", bowl(0.004, 0.1))}
    root, export = tmp_path / "runs", tmp_path / "export"
    exported_before: list[int] = []

    def fake_train(self, spec, slot):
        exported_before.append(len(list(export.glob("*/*/eval.json"))))
        run = Path(spec.run_dir(str(root), suite.profile))
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "last.ckpt").write_bytes(b"w")
        (run / "config.yaml").write_text(f"seed_everything: {spec.seed}\n")
        (run / "eval.json").write_text(json.dumps({"finished": True, "val_loss": scores[spec].val_loss}))
        return 0

    def fake_evaluate(suite_, run_dirs):  # the test split lands in eval.json, as eval writes it
        for d in run_dirs:
            record = json.loads((Path(d) / "eval.json").read_text())
            (Path(d) / "eval.json").write_text(json.dumps({**record, "test": {"loss": 5.0}}))

    monkeypatch.setattr(suite_runner.SuiteTrainer, "train", fake_train)
    monkeypatch.setattr(suite_runner.SuiteTrainer, "prepare_data", lambda self, specs: None)
    monkeypatch.setattr(suite_runner, "evaluate_test", fake_evaluate)
    assert suite_runner.train_suite(suite, design, str(root), jobs=1, export=str(export)) == set()
    assert exported_before == list(range(len(scores)))  # every earlier run exported before the next one started
    copies = sorted(p.relative_to(export) for p in export.rglob("*") if p.is_file())
    assert copies == sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.suffix != ".ckpt")
    pick_seed = RunSpec("a-12l", Setting(0.002, 0.3), 1).run_dir(str(export), suite.profile)
    assert json.loads((Path(pick_seed) / "eval.json").read_text())["test"] == {"loss": 5.0}  # copied again


def test_a_pick_at_the_edge_extends_the_grid_at_most_twice_and_says_so_if_still_there(tmp_path, recipes):
    design = TunedBudget(load(str(suite_file(tmp_path))))
    once = outcomes_for(design, "a-12l", bowl(0.016))  # best one point beyond the grid
    sel = design.select("a-12l", once)[0]  # 0.016 is the new edge; a second point shows it lies inside
    assert sel.extensions == [Setting(0.016, 0.3), Setting(0.032, 0.3)] and sel.pick == Setting(0.016, 0.3)
    assert sel.lr_edge is None and len(once) == 8 + 2 + 5 + 2
    far = outcomes_for(design, "a-12l", bowl(1.0))
    sel = design.select("a-12l", far)[0]
    assert sel.extensions == [Setting(0.016, 0.3), Setting(0.032, 0.3)] and sel.lr_edge == "highest"
    assert len(far) == design.max_runs == 8 + 2 + 5 + 2
    down = design.select("a-12l", outcomes_for(design, "a-12l", bowl(0.00025)))[0]
    assert down.extensions[0] == Setting(0.0005, 0.3)


def test_a_recipe_that_diverges_everywhere_gets_no_seeds(tmp_path, recipes):
    design = TunedBudget(load(str(suite_file(tmp_path))))
    runs = outcomes_for(design, "a-12l", lambda s, seed: None)
    sel = design.select("a-12l", runs)[0]
    assert len(runs) == 8 and sel.complete and sel.pick is None and sel.extensions == []


def fake_run(
    root: Path,
    spec: RunSpec,
    val: float | None,
    *,
    test: float | None = None,
    reference="r1",
    model="m1",
    machine="CPU X",
    step: int = 6,
    wall_s: float | None = None,
) -> RunOutcome:
    """A finished run directory as a suite's run leaves it (eval.json, manifest), and its outcome."""
    run_dir = spec.run_dir(str(root), "smoke")
    run_dir.mkdir(parents=True)
    summary = {
        "finished": True,
        "step": step,
        "val_loss": val,
        "val_bpb": None if val is None else val / 2,
        "diverged": val is None,
        **({"wall_s": wall_s} if wall_s is not None else {}),
    }
    if test is not None:
        summary["eval"] = {"step": 6, "precision": "32-true", "trained_precision": "32-true", "test": {"loss": test}}
    (run_dir / "eval.json").write_text(json.dumps(summary))
    arithmetic = {
        "precision": "32-true",
        "torch": "2.13",
        "portable": True,
        "fingerprint": {"version": 1, "reference": reference, "model": model},
    }
    segment = {"arithmetic": arithmetic, "hardware": {"cpu": machine}, "code_revision": "abc"}
    (run_dir / "manifest.json").write_text(json.dumps({**segment, "segments": [segment]}))
    return RunOutcome(spec, val, diverged=val is None)


def test_progress_says_the_time_left_at_each_recipes_own_pace(tmp_path, recipes, capsys):
    """a's three full runs took 100, 120 and 110 s (median 110), b's one 300 s, and b's run that diverged at step
    3 is not a pace; 17 runs at most a recipe; 2 at a time."""
    from resnorm_lm.analysis.suite_runner import Progress

    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    grid = [RunSpec(r, s, 0) for r in ("a-12l", "b-12l") for s in design.grid(r)]
    progress = Progress(suite, design, str(tmp_path), jobs=2)
    progress.say({}, [], grid)
    said = "suite suite: 0 runs finished, 0 training, 16 more wanted now (at most 34 in all)\n"
    assert capsys.readouterr().out == said  # no pace yet: no time
    timed = [(grid[0], 100), (grid[1], 120), (grid[2], 110), (grid[8], 300)]
    outcomes = {spec: fake_run(tmp_path, spec, 5.0, wall_s=seconds) for spec, seconds in timed}
    outcomes[grid[9]] = fake_run(tmp_path, grid[9], None, step=3, wall_s=10)
    todo = [*grid[3:8], *grid[10:]]  # 5 of a's, 6 of b's
    progress.say(outcomes, [], todo)
    line = capsys.readouterr().out
    assert "5 runs finished, 0 training, 11 more wanted now (at most 34 in all)" in line
    assert "about 20 min for those" in line  # (5 x 110 + 6 x 300) / 2 = 1175 s
    assert "at most 50 min (2 at a time" in line  # ((17 - 3) x 110 + (17 - 2) x 300) / 2 = 3020 s
    assert "over 4 finished full-length runs)" in line  # every recipe timed: no guess named
    progress.say(dict(list(outcomes.items())[:3]), [], todo)
    line = capsys.readouterr().out
    assert "b-12l not timed yet, counted at the others' median)" in line  # b's one run not among the three
    assert "about 10 min for those" in line  # 11 x 110 / 2 = 605 s
    progress.say(outcomes, [], todo)
    capsys.readouterr()
    progress.say(outcomes, [], todo)
    assert capsys.readouterr().out == ""  # said once until the counts change


def test_the_table_counts_a_stuck_seed_apart_and_pairs_the_rest_by_seed(tmp_path, recipes):
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    outcomes = {}
    shared = {1: 0.00, 2: 0.04, 3: -0.03, 4: 0.02, 5: -0.01}  # what seed k's data order does to both recipes
    for recipe, base in (("a-12l", 5.00), ("b-12l", 5.10)):
        planned = outcomes_for(design, recipe, bowl(0.002))
        for spec in planned:
            val = bowl(0.002)(spec.setting, spec.seed) + (base - 5.0) + shared.get(spec.seed, 0)
            if recipe == "b-12l" and spec.seed == 3 and spec.setting == design.select(recipe, planned)[0].pick:
                val = 6.45  # stuck near the unigram loss: counted, not averaged
            outcomes[spec] = fake_run(tmp_path / "runs", spec, val, test=val + 0.2)
    report = TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)
    rows = {r["recipe"]: r for r in report.rows()}
    a, b = rows["a-12l"], rows["b-12l"]
    assert a["failures"].k == 0 and (b["failures"].k, b["failures"].n) == (1, 5)
    assert b["failure_kinds"] == "not learning"
    assert b["val_loss"].n == 4 and b["val_loss"].mean < 5.2  # the stuck seed is not in the mean
    assert b["delta_val"].n == 4 and b["delta_val"].mean == pytest.approx(0.10, abs=1e-9)
    assert b["delta_val"].half_width == pytest.approx(0.0, abs=1e-9)  # the shared part cancels exactly
    assert b["delta_test"].n == 4 and a["group"] == "a" and b["group"] == "b"
    assert a["runs"] == b["runs"] == 15 and a["status"] == "complete"
    assert a["lr_range"] == "0.002 only"  # 0.1 nats a factor 2 away: outside 0.05
    selection = [r for r in report.grid_rows() if r["role"] == "selection"]
    assert len(selection) == 16 and all(r["seed"] == 0 for r in selection)


def test_a_tie_is_listed_with_its_paired_interval_and_every_pair_goes_to_pairs_csv(tmp_path, recipes):
    """b is 0.01 behind a on average but by +0.05 or -0.03 seed by seed: not separated, so both rows take the
    letter a, the markdown lists the pair under "Ties" with its interval, and pairs.csv holds it."""
    from resnorm_lm.analysis.suite_report import write_tuned

    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    noise = {1: 0.05, 2: -0.03, 3: 0.05, 4: -0.03, 5: 0.01}  # b's seed-by-seed difference from a (mean 0.01)
    outcomes = {}
    for recipe in ("a-12l", "b-12l"):
        for spec in outcomes_for(design, recipe, bowl(0.002)):
            extra = noise.get(spec.seed, 0) if recipe == "b-12l" else 0
            outcomes[spec] = fake_run(tmp_path / "runs", spec, bowl(0.002)(spec.setting, spec.seed) + extra)
    report = TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)
    rows = report.rows()
    assert [(r["recipe"], r["group"]) for r in rows] == [("a-12l", "a"), ("b-12l", "a")]
    (pair,) = report.pair_rows(["a-12l", "b-12l"])
    assert (pair["better"], pair["worse"], pair["separated"]) == ("a-12l", "b-12l", False)
    assert pair["delta_val"].mean == pytest.approx(0.01) and pair["delta_val"].n == 5
    written = write_tuned(report, rows, table_provenance([]), False, tmp_path / "out")
    markdown = (tmp_path / "out" / "suite.md").read_text()
    tie = f"| `a-12l` | `b-12l` | +0.010 ± {pair['delta_val'].half_width:.3f} | 5 |"
    assert "Ties (what the letters rest on)" in markdown and tie in markdown
    (saved,) = list(csv.DictReader(open(tmp_path / "out" / "pairs.csv")))
    assert tmp_path / "out" / "pairs.csv" in written
    assert (
        saved["better"] == "a-12l"
        and saved["separated"] == "False"
        and float(saved["delta_val_mean"]) == (pytest.approx(0.01))
    )


def test_the_table_says_how_many_settings_learned_at_the_selection_seed(tmp_path, recipes):
    """a's grid: 8e-3 diverges at both warmups and 4e-3 at warmup 0.1 stays near the unigram loss, so 5 of its 8
    settings learned; b's grid has not begun."""
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)

    def loss(setting, seed):
        if seed == 0 and setting.lr == 0.008:
            return None
        return 6.45 if seed == 0 and (setting.lr, setting.warmup) == (0.004, 0.1) else bowl(0.002)(setting, seed)

    outcomes = {
        spec: fake_run(tmp_path / "runs", spec, o.val_loss) for spec, o in outcomes_for(design, "a-12l", loss).items()
    }
    report = TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)
    rows = {r["recipe"]: r for r in report.rows()}
    assert rows["a-12l"]["settings_learned"] == "5/8" and rows["b-12l"]["settings_learned"] == "-"
    markdown = tuned_markdown(report, report.rows(), table_provenance([]), partial=True)
    assert "| settings learned |" in markdown and "| 5/8 |" in markdown


def test_a_suite_under_way_renders_its_figures_with_the_recipes_not_yet_run_marked(tmp_path, recipes):
    """Part of the way through (a's grid run, b's not started), the report and both figures are written; b's
    panel says it has no runs instead of failing on an empty log axis."""
    from resnorm_lm.analysis.suite_report import plot_lr_panels, plot_paired_differences

    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    outcomes = {
        spec: fake_run(tmp_path / "runs", spec, bowl(0.002)(spec.setting, spec.seed))
        for spec in outcomes_for(design, "a-12l", bowl(0.002))
    }
    report = TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)
    rows = report.rows()
    assert {r["recipe"]: r["runs"] for r in rows} == {"a-12l": 15, "b-12l": 0}
    panels = plot_lr_panels(report, rows, tmp_path)
    assert panels.stat().st_size > 0
    begun = {s: fake_run(tmp_path / "runs", s, 5.3) for s in design.plan(outcomes) if s.recipe == "b-12l"}
    begun = dict(list(begun.items())[:3])  # three of b's grid runs finished: drawn, no pick yet
    partial = TunedReport(suite, design, {**outcomes, **begun}, str(tmp_path / "runs"), UNIGRAM)
    assert len(partial.selections["b-12l"].scores) == 3 and partial.selections["b-12l"].pick is None
    assert plot_lr_panels(partial, partial.rows(), tmp_path).stat().st_size > 0
    forest = plot_paired_differences(report, rows, tmp_path)  # b has nothing to pair: drawn without it, or not at all
    assert forest is None or forest.stat().st_size > 0


def write_metrics(run_dir: Path, train: list[tuple[int, float]], val: list[tuple[int, float]]) -> None:
    """A metrics.csv as the run logs it: train/loss rows and val/loss rows, each with its step."""
    lines = ["step,train/loss,val/loss"] + [f"{s},{v}," for s, v in train] + [f"{s},,{v}" for s, v in val]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_the_fit_table_gives_the_gap_and_the_seeds_whose_validation_turned_up(tmp_path, recipes):
    """A's validation falls to the end; b's is lowest at step 250 in seeds 1 and 2: the table says 2/5, by how
    much and where, and both gaps are validation minus the training loss of the last 10% of steps."""
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    outcomes = {}
    for recipe in ("a-12l", "b-12l"):
        for spec in outcomes_for(design, recipe, bowl(0.002)):
            val = bowl(0.002)(spec.setting, spec.seed)
            outcomes[spec] = fake_run(tmp_path / "runs", spec, val)
            turns = recipe == "b-12l" and spec.seed in (1, 2)
            tail = [(450, 4.49), (460, 4.51), (470, 4.50), (480, 4.49), (490, 4.51)]  # the last 10%: mean 4.50
            train = [(s, 6.0) for s in range(0, 440, 10)] + tail
            write_metrics(
                spec.run_dir(str(tmp_path / "runs"), "smoke"),
                train,
                [(250, val - 0.03 if turns else val + 0.2), (499, val)],
            )
    report = TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)
    rows = {r["recipe"]: r for r in report.rows()}
    a, b = rows["a-12l"], rows["b-12l"]
    assert a["train_loss"].mean == pytest.approx(4.50) and a["train_loss"].n == 5  # step 440 (6.0) is not in it
    assert a["gap"].mean == pytest.approx(a["val_loss"].mean - 4.50)
    assert (a["val_turned_up"].k, b["val_turned_up"].k, b["val_turned_up"].n) == (0, 2, 5)
    assert b["val_rise"].mean == pytest.approx(0.03) and b["best_steps"] == "250, 250"
    from resnorm_lm.analysis.suite_report import fit_table

    table = "\n".join(fit_table(report.rows()))
    assert "| `b-12l` |" in table and "| 2/5 (" in table and "| +0.030 ± 0.000 | 250, 250 |" in table


def finished_report(tmp_path: Path) -> tuple[TunedBudget, dict[RunSpec, RunOutcome], TunedReport]:
    """suite_file's suite with every run of a and b finished as the bowl says (under tmp_path/runs), and its report."""
    suite = load(str(suite_file(tmp_path)))
    design = TunedBudget(suite)
    outcomes = {}
    for recipe in ("a-12l", "b-12l"):
        for spec in outcomes_for(design, recipe, bowl(0.002)):
            outcomes[spec] = fake_run(tmp_path / "runs", spec, bowl(0.002)(spec.setting, spec.seed))
    return design, outcomes, TunedReport(suite, design, outcomes, str(tmp_path / "runs"), UNIGRAM)


def write_gain(run_dir: Path, gains: list[tuple[int, float, float]]) -> None:
    """A metrics.csv as an HC run logs its stream-mix gain: a (step, forward, backward) row each log."""
    lines = ["step,hc/gain_backward,hc/gain_forward,train/loss"] + [f"{s},{b},{f},5.0" for s, f, b in gains]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_the_gain_table_gives_each_hc_recipes_final_and_peak_gain_and_its_gain_by_lr(tmp_path, recipes):
    """b logs the gain (its pick's seed k peaks at 10k forward and 11k backward at step 4 and ends at k^2 and 2k, so
    no median is a mean; at the selection seed the final gain is 1000 x the LR forward and 1 backward): its row
    gives the median and range over the five fresh seeds in both directions, its by-LR column the selection seed's
    final gains at the pick's warmup; a logs none and has no row; gain.csv
    and the figure are written. A suite where no run logs it renders no gain table."""
    from resnorm_lm.analysis.stream_gain import gain_rows
    from resnorm_lm.analysis.suite_report import write_tuned

    design, outcomes, report = finished_report(tmp_path)
    assert gain_rows(report) == [] and "Stream-mix gain" not in tuned_markdown(
        report, report.rows(), table_provenance([]), False
    )
    pick = report.selections["b-12l"].pick
    for spec in outcomes:
        if spec.recipe != "b-12l":
            continue
        k = spec.seed
        gains = (
            [(0, 1.0, 1.0), (4, 10.0 * k, 11.0 * k), (6, float(k * k), 2.0 * k)] if spec.setting == pick and k else []
        )
        if k == design.selection_seed:
            gains = [(0, 1.0, 1.0), (6, 1000 * spec.setting.lr, 1.0)]
        write_gain(spec.run_dir(str(tmp_path / "runs"), "smoke"), gains)
    (row,) = gain_rows(report)
    assert row["recipe"] == "b-12l" and row["seeds"] == 5 and row["warmup"] == pick.warmup
    assert row["final_forward"] == "9 (1..25)" and row["final_backward"] == "6 (2..10)"
    assert row["peak_forward"] == "30 (10..50)" and row["peak_backward"] == "33 (11..55)"
    assert row["by_lr"] == "0.001: 1 / 1, 0.002: 2 / 1, 0.004: 4 / 1, 0.008: 8 / 1"
    written = write_tuned(report, report.rows(), table_provenance([]), False, tmp_path / "out")
    markdown = (tmp_path / "out" / "suite.md").read_text()
    assert (
        "| `b-12l` | 5 | 9 (1..25) | 6 (2..10) | 30 (10..50) | 33 (11..55) | 0.3 | 0.001: 1 / 1, 0.002: 2 / 1,"
        in markdown
    )
    assert "| `a-12l` | 5 | " not in markdown.split("Stream-mix gain")[1]
    assert tmp_path / "out" / "gain.csv" in written and (tmp_path / "out" / "stream_gain.png").stat().st_size > 0
    (saved,) = list(csv.DictReader(open(tmp_path / "out" / "gain.csv")))
    assert saved["recipe"] == "b-12l" and saved["final_forward"] == "9 (1..25)"


def write_per_block(run_dir: Path, rows: list[tuple[int, list[float], list[float]]]) -> None:
    """A metrics.csv as a run logs its per-block metrics: (step, gradient norms, stream RMS) per log, block 0 first."""
    n = len(rows[0][1])
    head = ["step", *(f"grad_norm/layer_{i:02d}" for i in range(n)), *(f"stream_rms/layer_{i:02d}" for i in range(n))]
    lines = [",".join(head)] + [",".join(map(str, [s, *g, *r])) for s, g, r in rows]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_the_depth_table_gives_each_picks_last_block_over_its_first(tmp_path, recipes):
    """b's fresh seed k logs at steps 0, 100, ..., 1000 a gradient ratio (last block / first) of 1 at step 0, 50k
    at step 300 (its peak), and k at every step from 900 on (the last 10%: 900 and 1000, so the end is k); its
    stream ratio ends at 2k. Rows give median (min..max) over the five seeds; one seed that did not learn is left
    out; a, with no per-block columns, has no row; balance.csv is written."""
    from resnorm_lm.analysis.depth_balance import balance_rows
    from resnorm_lm.analysis.suite_report import write_tuned

    design, outcomes, report = finished_report(tmp_path)
    assert balance_rows(report) == []
    pick = report.selections["b-12l"].pick
    for spec in outcomes:
        if spec.recipe == "b-12l" and spec.setting == pick and spec.seed in design.seeds:
            k = spec.seed
            ratio = {0: 1.0, 300: 50.0 * k, 900: float(k), 1000: float(k)}
            logs = [(s, [2.0, 3.0, 2.0 * ratio.get(s, 1.5)], [1.0, 1.0, 2.0 * k]) for s in range(0, 1001, 100)]
            write_per_block(spec.run_dir(str(tmp_path / "runs"), "smoke"), logs)
    (row,) = balance_rows(report)
    assert row == {
        "recipe": "b-12l",
        "seeds": 5,
        "grad_end": "3 (1..5)",
        "grad_peak": "150 (50..250)",
        "stream_end": "6 (2..10)",
    }
    failed = RunSpec("b-12l", pick, 5)
    learned, report.outcomes[failed] = report.outcomes[failed], RunOutcome(failed, None, diverged=True)
    assert balance_rows(report)[0]["seeds"] == 4 and balance_rows(report)[0]["grad_end"] == "2.5 (1..4)"
    report.outcomes[failed] = learned
    written = write_tuned(report, report.rows(), table_provenance([]), False, tmp_path / "out")
    markdown = (tmp_path / "out" / "suite.md").read_text()
    assert "| `b-12l` | 5 | 3 (1..5) | 150 (50..250) | 6 (2..10) |" in markdown
    assert "| `a-12l` | 5 | " not in markdown.split("Across depth")[1].split("Stream-mix")[0]
    assert tmp_path / "out" / "balance.csv" in written


def test_the_gradient_table_gives_each_picks_global_gradient_norm_over_training_and_its_clip_record(tmp_path, recipes):
    """b's fresh seed k logs the global gradient norm at steps 0, 100, ..., 1000: 100k at the first, 50 up to the
    middle, then k at every step from 500 on but 3k at step 700 (the second half's median k, its largest 3k), and
    its eval.json records the clip bound at k/10 of the steps. Rows give median (min..max) over the five seeds; a
    seed that did not learn is left out; a, which logs none, has no row; gradients.csv is written."""
    from resnorm_lm.analysis.gradient_record import gradient_rows
    from resnorm_lm.analysis.suite_report import write_tuned

    design, outcomes, report = finished_report(tmp_path)
    assert gradient_rows(report) == []
    pick = report.selections["b-12l"].pick
    for spec in outcomes:
        if spec.recipe == "b-12l" and spec.setting == pick and spec.seed in design.seeds:
            k = spec.seed
            norms = {
                s: (100.0 * k if s == 0 else 50.0 if s < 500 else 3.0 * k if s == 700 else float(k))
                for s in range(0, 1001, 100)
            }
            run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
            lines = ["step,grad_norm/total,train/loss"] + [f"{s},{g},5.0" for s, g in norms.items()]
            (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
            summary = json.loads((run_dir / "eval.json").read_text())
            summary["clip"] = {"clipped_fraction": k / 10, "clipped_steps": 100 * k, "max_norm": 1.0, "steps": 1000}
            (run_dir / "eval.json").write_text(json.dumps(summary))
    (row,) = gradient_rows(report)
    assert row == {
        "recipe": "b-12l",
        "seeds": 5,
        "first": "300 (100..500)",
        "late_median": "3 (1..5)",
        "late_max": "9 (3..15)",
        "clipped": "0.3 (0.1..0.5)",
    }
    failed = RunSpec("b-12l", pick, 5)
    learned, report.outcomes[failed] = report.outcomes[failed], RunOutcome(failed, None, diverged=True)
    assert gradient_rows(report)[0]["seeds"] == 4 and gradient_rows(report)[0]["late_median"] == "2.5 (1..4)"
    report.outcomes[failed] = learned
    written = write_tuned(report, report.rows(), table_provenance([]), False, tmp_path / "out")
    markdown = (tmp_path / "out" / "suite.md").read_text()
    assert "| `b-12l` | 5 | 300 (100..500) | 3 (1..5) | 9 (3..15) | 0.3 (0.1..0.5) |" in markdown
    assert "| `a-12l` | 5 | " not in markdown.split("Gradient norm (the same seeds)")[1]
    assert tmp_path / "out" / "gradients.csv" in written


def test_runs_of_different_arithmetic_are_refused_in_one_table_unless_marked(tmp_path):
    specs = [RunSpec("a-12l", Setting(1e-3, 0.1), k) for k in (1, 2)] + [RunSpec("b-12l", Setting(1e-3, 0.1), 1)]
    dirs = []
    for spec, reference in zip(specs, ("r1", "r1", "r2")):
        fake_run(tmp_path, spec, 5.0, reference=reference, machine="EPYC" if reference == "r1" else "Xeon")
        dirs.append((spec.recipe, spec.run_dir(str(tmp_path), "smoke")))
    provenance = table_provenance(dirs)
    with pytest.raises(ProvenanceError, match=r"different arithmetic: A: r1 \(v1\) \(2 runs, on EPYC\); B: r2"):
        provenance.check(allow_mixed=False)
    provenance.check(allow_mixed=True)
    assert provenance.row_mark("a-12l") == "A" and provenance.row_mark("b-12l") == "B"
    assert table_provenance(dirs[:2]).problems() == []  # one arithmetic: one table


def test_the_provenance_says_a_gpus_kernels_as_the_gpus_not_the_cpu_caps_its_environment_also_set(tmp_path):
    spec = RunSpec("a-12l", Setting(1e-3, 0.1), 1)
    fake_run(tmp_path, spec, 5.0, machine="EPYC")
    cpu = table_provenance([("a-12l", spec.run_dir(str(tmp_path), "smoke"))]).lines()[0]
    assert "kernels portable (AVX2 caps, one thread)" in cpu
    manifest = spec.run_dir(str(tmp_path), "smoke") / "manifest.json"
    record = json.loads(manifest.read_text())
    for segment in (record, *record["segments"]):  # the suite's portable env on an H100: CPU caps, GPU kernels
        segment["arithmetic"].update(device="NVIDIA H100 80GB HBM3", tf32=False)
        segment["hardware"] = {"cpu": "Xeon", "gpus": ["NVIDIA H100 80GB HBM3"]}
    manifest.write_text(json.dumps(record))
    gpu = table_provenance([("a-12l", spec.run_dir(str(tmp_path), "smoke"))]).lines()[0]
    assert "on NVIDIA H100 80GB HBM3" in gpu and "kernels CUDA, TF32 off" in gpu and "AVX2" not in gpu


def test_a_recipe_whose_code_changed_its_numbers_between_runs_is_refused(tmp_path):
    dirs = []
    for k, model in ((1, "m1"), (2, "m2")):
        spec = RunSpec("a-12l", Setting(1e-3, 0.1), k)
        fake_run(tmp_path, spec, 5.0, model=model)
        dirs.append((spec.recipe, spec.run_dir(str(tmp_path), "smoke")))
    assert any("a-12l's runs have 2 model fingerprints" in p for p in table_provenance(dirs).problems())


def test_runs_from_before_fingerprints_are_known_by_machine_precision_and_torch(tmp_path):
    dirs = []
    for k, cpu in ((1, "EPYC"), (2, "EPYC"), (3, "Xeon")):
        run_dir = tmp_path / f"run{k}"
        run_dir.mkdir()
        (run_dir / "manifest.json").write_text(
            json.dumps({"hardware": {"cpu": cpu}, "precision": "32-true", "packages": {"torch": "2.13"}})
        )
        dirs.append(("a-12l", run_dir))
    assert table_provenance(dirs[:2]).problems() == []
    assert "EPYC / 32-true / torch 2.13" in table_provenance(dirs).problems()[0]


def test_the_seed_pilot_separates_the_init_from_the_data_order(tmp_path, recipes):
    pilot = {
        "settings": {"a-12l": {"lr": 4e-3, "warmup": 0.25}, "b-12l": {"lr": 1e-3, "warmup": 0.5}},
        "seeds": [1, 2, 3],
        "fixed_seed": 1,
    }
    design = SeedPilot(load(str(suite_file(tmp_path, design="seeds", budget=None, pilot=pilot))))
    cells = design.cells("a-12l")
    assert [(s.seed, s.init_seed, s.data_seed) for s in cells["init"]] == [(1, None, None), (2, None, 1), (3, None, 1)]
    assert [(s.seed, s.init_seed, s.data_seed) for s in cells["data"]] == [(1, None, None), (2, 1, None), (3, 1, None)]
    plan = design.plan({})
    assert len(plan) == 2 * design.max_runs == 14 and len(set(plan)) == 14
    assert plan[0].run_dir("r", "cpu").name == "cpu-lr0.004-wf0.25-seed1"
    assert cells["init"][1].run_dir("r", "cpu").name == "cpu-lr0.004-wf0.25-seed2-data1"
    assert cells["data"][2].run_dir("r", "cpu").name == "cpu-lr0.004-wf0.25-seed3-init1"
    assert cells["data"][2].overrides()[-1] == "--model.init_seed=1"


@pytest.mark.training
def test_a_tiny_suite_trains_resumes_and_never_trains_a_finished_run_twice(tmp_path, fits_in_this_process):
    corpus = write_learnable_corpus(tmp_path / "corpus")
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "about": "tiny",
                "design": "tuned",
                "profile": "smoke",
                "recipes": ["prenorm-12l", "postnorm-12l"],
                "reference": "prenorm-12l",
                "arithmetic": "native",
                "train": {
                    "trainer.max_steps": 60,
                    "trainer.val_check_interval": 60,
                    "model.optim.schedule": "wsd",
                    "data.corpus": "text",
                    "data.files": [corpus],
                    "data.cache_dir": str(tmp_path / "cache"),
                    "trainer.enable_progress_bar": False,
                },
                "budget": {
                    "lrs": [1e-5, 3e-3, 1e-2],
                    "warmups": [0.2],
                    "selection_seed": 0,
                    "extensions": 1,
                    "seeds": [1, 2],
                    "runner_up_seeds": [1],
                },
            }
        )
    )
    args = ["suite", str(path), "--root", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--jobs", "1"]
    first = run_cli_captured(args)
    assert first.returncode == 0, first.stderr[-3000:]
    table = list(csv.DictReader((tmp_path / "results" / "tiny" / "table.csv").open()))
    assert [r["recipe"] for r in table] and {r["status"] for r in table} == {"complete"}
    assert all(int(r["runs"]) <= 3 + 1 + 2 + 1 for r in table)
    runs = list(csv.DictReader((tmp_path / "results" / "tiny" / "runs.csv").open()))
    assert {r["role"] for r in runs} >= {"selection", "pick"} and all(
        r["seed"] != "0" for r in runs if r["role"] == "pick"
    )
    markdown = (tmp_path / "results" / "tiny" / "tiny.md").read_text()
    assert "Provenance" in markdown and "| `prenorm-12l` |" in markdown and "reference" in markdown
    for row in table:  # test evaluated at the picks' fresh seeds, and only there
        assert float(row["test_loss_mean"]) > 0
    tested = [
        p for p in (tmp_path / "runs").glob("*/*/eval.json") if "test" in json.loads(p.read_text()).get("eval", {})
    ]
    assert tested and not any(p.parent.name.endswith("seed0") for p in tested)
    again = run_cli_captured(args)  # everything finished: nothing trains, the same table
    assert again.returncode == 0 and "suite: training" not in again.stdout
    assert list(csv.DictReader((tmp_path / "results" / "tiny" / "table.csv").open()))[0]["recipe"] == table[0]["recipe"]
    twin = tmp_path / "twin.yaml"  # another suite that wants the same runs: it takes them, and trains none
    twin.write_text(path.read_text())
    reuse = ["suite", str(twin), "--root", str(tmp_path / "twin"), "--results", str(tmp_path / "results")]
    taken = run_cli_captured([*reuse, "--reuse", str(tmp_path / "runs"), "--no-train"])
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert f"{len(runs)} finished run(s) reused" in taken.stdout and "not reused" not in taken.stdout
    twin_table = list(csv.DictReader((tmp_path / "results" / "twin" / "table.csv").open()))
    assert [(r["recipe"], r["val_loss_mean"]) for r in twin_table] == [(r["recipe"], r["val_loss_mean"]) for r in table]
