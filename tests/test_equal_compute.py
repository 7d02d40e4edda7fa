"""The reference at a design's compute (``compute_of``, resnorm_lm/analysis/equal_compute.py): the suite files of the
repository count their steps right, a file that changes more than the steps is refused, and equal-compute.md pairs
the design with the reference at equal steps and at equal FLOPs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from resnorm_lm.analysis import equal_compute
from resnorm_lm.analysis.suite import SuiteError, TunedBudget, available_suites, load, main
from tests.test_suite import UNIGRAM, bowl, fake_run, outcomes_for, recipes, suite_file  # noqa: F401

COMPUTE_SUITES = [name for name in available_suites() if name.startswith("designs-") and "-equal-flops-" in name]


def test_the_repositorys_equal_flops_suites_are_pre_norm_at_hc_and_mhc_s_compute():
    assert sorted(COMPUTE_SUITES) == [f"designs-{d}-equal-flops-{x}" for d in ("12l", "24l") for x in ("hc", "mhc")]
    for name in COMPUTE_SUITES:
        suite = load(name)  # nothing but trainer.max_steps differs from its base suite: load checks it
        base, design = suite.compute_of
        assert suite.recipes == [load(base).reference] and design in load(base).recipes


@pytest.mark.parametrize("name", ["designs-12l-equal-flops-hc", "designs-12l-equal-flops-mhc"])
def test_the_steps_of_each_equal_flops_suite_are_the_counted_ratio(name):
    suite = load(name)
    base = load(suite.compute_of[0])
    assert equal_compute.steps_mismatch(suite, base) is None
    steps, ratio = equal_compute.matched_steps(base, suite.compute_of[1])
    assert ratio > 1.02 and steps == suite.max_steps  # HC's and mHC's stream mixing are counted matrix products


@pytest.mark.slow
@pytest.mark.parametrize("name", ["designs-24l-equal-flops-hc", "designs-24l-equal-flops-mhc"])
def test_the_steps_of_each_24_block_equal_flops_suite_are_the_counted_ratio(name):
    suite = load(name)
    assert equal_compute.steps_mismatch(suite, load(suite.compute_of[0])) is None


def test_counted_flops_see_what_the_parameter_formula_misses():
    """HC's parameters are 0.6% more than pre-norm's, its counted FLOPs 4% more: the stream mixing is products."""
    from resnorm_lm.model.gpt import GPT, count_parameters
    from resnorm_lm.train.recipes import recipe_arch

    flops = {r: equal_compute.recipe_flops_per_token(r, "cpu") for r in ("prenorm-12l", "hc-12l")}
    params = {r: count_parameters(GPT(recipe_arch(r, "cpu"))) for r in flops}
    assert flops["hc-12l"] / flops["prenorm-12l"] > 1.03 > 1.01 > params["hc-12l"] / params["prenorm-12l"]


def compute_file(tmp_path: Path, **changes) -> Path:
    """suite.yaml (a-12l the reference, b-12l the design, 6 steps) and at-b.yaml: a-12l at b-12l's compute, which
    the tests count at 1.5 times a-12l's (9 steps)."""
    raw = yaml.safe_load(suite_file(tmp_path).read_text())
    raw.update({"compute_of": {"suite": "suite", "recipe": "b-12l"}, "recipes": ["a-12l"]})
    raw["train"] = {"trainer.max_steps": 9}
    raw.update(changes)
    path = tmp_path / "at-b.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def counted(monkeypatch):
    """b-12l counts 1.5 times a-12l's FLOPs per token."""
    monkeypatch.setattr(equal_compute, "recipe_flops_per_token", lambda r, p: {"a-12l": 2.0, "b-12l": 3.0}[r])


@pytest.mark.parametrize(
    "change, said",
    [
        ({"compute_of": "suite"}, "compute_of: {suite: <a suite>, recipe: <one of its recipes>}"),
        ({"compute_of": {"suite": "suite", "recipe": "a-12l"}}, "other than its reference a-12l"),
        ({"compute_of": {"suite": "suite", "recipe": "sandwich-12l"}}, "recipe 'sandwich-12l': one of suite's"),
        ({"recipes": ["a-12l", "b-12l"]}, "recipes: [a-12l] only"),
        ({"train": {"trainer.max_steps": 9, "trainer.gradient_clip_val": 1.0}}, "train differs beyond"),
        ({"profile": "cpu"}, "its profile differs (cpu against smoke)"),
        ({"compute_of": {"suite": "at-b", "recipe": "b-12l"}}, "compute_of: a suite cannot name itself"),
    ],
)
def test_a_file_that_changes_more_than_the_steps_is_refused(tmp_path, recipes, change, said):  # noqa: F811
    assert load(str(compute_file(tmp_path))).compute_of == ("suite", "b-12l")  # as written: accepted
    with pytest.raises(SuiteError) as err:
        load(str(compute_file(tmp_path, **change)))
    assert said in str(err.value)


def test_steps_other_than_the_count_are_refused_before_anything_trains(tmp_path, recipes, counted, capsys):  # noqa: F811
    path = compute_file(tmp_path, train={"trainer.max_steps": 10})
    assert main([str(path), "--root", str(tmp_path / "runs"), "--no-train"]) == 2
    err = capsys.readouterr().err
    assert "trainer.max_steps must be 9 (6 x 1.5000, b-12l's counted training FLOPs per token over a-12l's)" in err
    assert not (tmp_path / "runs").exists()


def train_both(
    tmp_path: Path, at_b: Path, a_gain_at_9: dict[int, float], arithmetic: str = "r1", b_diverges: int | None = None
) -> None:
    """Fake runs of both suites: b-12l 0.1 nats ahead of a-12l at 6 steps in every seed (but ``b_diverges``, a
    fresh seed that diverges); a-12l at 9 steps lower than at 6 by ``a_gain_at_9[seed]``. Every run's test loss is
    its validation loss plus 0.12."""
    design = TunedBudget(load(str(tmp_path / "suite.yaml")))
    for recipe, offset in (("a-12l", 0.0), ("b-12l", -0.1)):
        for spec in outcomes_for(design, recipe, bowl(0.002)):
            val = bowl(0.002)(spec.setting, spec.seed) + offset
            diverged = recipe == "b-12l" and spec.seed == b_diverges
            fake_run(tmp_path / "base", spec, None if diverged else val, test=None if diverged else val + 0.12)
    for spec in outcomes_for(TunedBudget(load(str(at_b))), "a-12l", bowl(0.002)):
        val = bowl(0.002)(spec.setting, spec.seed) - a_gain_at_9.get(spec.seed, 0.1)
        fake_run(tmp_path / "at-b", spec, val, test=val + 0.12, reference=arithmetic)


def test_equal_compute_md_sets_equal_steps_beside_equal_flops(tmp_path, recipes, counted, monkeypatch, capsys):  # noqa: F811
    """b is ahead of a at equal steps in every seed; given b's FLOPs (9 steps), a gains 0.1 nats give or take
    the seed: at equal FLOPs the two tie, and equal-compute.md says both, with their intervals."""
    from resnorm_lm.analysis import suite as suite_module

    monkeypatch.setattr(suite_module, "unigram_reference", lambda run_dir: UNIGRAM)
    at_b, results = compute_file(tmp_path), tmp_path / "results"
    gain = {1: 0.12, 2: 0.07, 3: 0.11, 4: 0.09, 5: 0.10}  # a at 9 steps minus a at 6, seed by seed (mean 0.098)
    train_both(tmp_path, at_b, gain)
    args = ["--no-train", "--results", str(results)]
    assert main([str(at_b), "--root", str(tmp_path / "at-b"), *args]) == 0  # before the base table exists
    assert "render it first (make suite SUITE=suite ARGS=--no-train)" in capsys.readouterr().out
    assert main([str(tmp_path / "suite.yaml"), "--root", str(tmp_path / "base"), *args]) == 0
    written_by_base = (results / "at-b" / "equal-compute.md").read_text()  # the base's render rewrites it too
    assert main([str(at_b), "--root", str(tmp_path / "at-b"), *args]) == 0
    markdown = (results / "at-b" / "equal-compute.md").read_text()
    assert markdown == written_by_base
    assert "`b-12l` counts 1.5000 times `a-12l`'s training FLOPs" in markdown
    assert "In 6 steps it spends what `a-12l` spends in 9" in markdown
    assert "- suite: arithmetic r1 (v1)" in markdown and "- at-b: arithmetic r1 (v1)" in markdown
    rows = list(csv.DictReader((results / "at-b" / "equal-compute.csv").open()))
    assert [(r["comparison"], r["reference_steps"], r["verdict"]) for r in rows] == [
        ("equal steps (6)", "6", "ahead"),
        ("equal FLOPs (9 steps)", "9", "tie"),
    ]
    assert float(rows[0]["delta_val_mean"]) == pytest.approx(-0.1)
    assert float(rows[1]["delta_val_mean"]) == pytest.approx(-0.1 + 0.098)  # b at 6 minus a at 9, paired
    assert int(rows[1]["delta_val_n"]) == 5 and float(rows[1]["delta_val_half_width"]) > 0.002
    for row in rows:  # the test split paired the same way (every fake run's test loss is its validation's + 0.12)
        assert float(row["delta_test_mean"]) == pytest.approx(float(row["delta_val_mean"]))
    runs = list(csv.DictReader((results / "at-b" / "runs.csv").open()))
    assert {r["role"] for r in runs if r["test_loss"]} == {"pick"}  # the test split beside the fresh seeds only
    assert "| equal FLOPs (9 steps) | 9 | 0.002 / 0.3 | 5/5 | 4.905 ± 0.024 | 0.002 / 0.3 | 5/5 |" in markdown


def test_two_arithmetics_are_not_paired_and_a_diverged_seed_is_counted_apart(tmp_path, recipes, counted, monkeypatch):  # noqa: F811
    from resnorm_lm.analysis import suite as suite_module

    monkeypatch.setattr(suite_module, "unigram_reference", lambda run_dir: UNIGRAM)
    at_b, results = compute_file(tmp_path), tmp_path / "results"
    train_both(tmp_path, at_b, {}, arithmetic="r2", b_diverges=3)
    args = ["--no-train", "--results", str(results)]
    assert main([str(tmp_path / "suite.yaml"), "--root", str(tmp_path / "base"), *args]) == 0
    assert main([str(at_b), "--root", str(tmp_path / "at-b"), *args]) == 0
    markdown = (results / "at-b" / "equal-compute.md").read_text()
    assert "do not share one arithmetic: the equal-FLOPs difference is left out" in markdown
    rows = list(csv.DictReader((results / "at-b" / "equal-compute.csv").open()))
    assert [r["verdict"] for r in rows] == ["ahead", "-"] and rows[1]["delta_val_mean"] == ""
    assert [r["design_learned"] for r in rows] == ["4/5", "4/5"]  # seed 3 diverged: counted apart, not paired
    assert int(rows[0]["delta_val_n"]) == 4
    assert float(rows[1]["reference_val_mean"]) == pytest.approx(5.003 - 0.1, abs=0.001)  # its own table's, unpaired


def test_a_verdict_whose_interval_ends_within_rounding_of_zero_says_how_close():
    """-0.020 ± 0.020 at three decimals reads as touching zero: where the end nearer zero rounds to 0.000 the
    verdict says where it ends; a clear separation, a tie, and no interval are left as they are."""
    from resnorm_lm.analysis.evidence import Interval
    from resnorm_lm.analysis.horizons import verdict_text

    edge = Interval(mean=-0.02005, half_width=0.02001, n=5)
    assert verdict_text(edge, "ahead") == "ahead, at the edge (the interval ends at -4.0e-05)"
    assert verdict_text(Interval(0.0300, 0.0298, 5), "behind").endswith("ends at +2.0e-04)")
    assert verdict_text(Interval(-0.046, 0.022, 5), "ahead") == "ahead"
    assert verdict_text(Interval(-0.01, 0.02, 5), "tie") == "tie"
    assert verdict_text(None, "-") == "-"
