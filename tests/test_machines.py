"""``resnorm-lm machines``: each committed suite's runs by arithmetic, and whether this machine can go on with it."""

from __future__ import annotations

import json

from resnorm_lm.analysis import machines


def committed_run(results, suite: str, run: str, *references: str) -> None:
    """A run's manifest as a suite's export leaves it: one segment for each machine it computed on."""
    run_dir = results / suite / "run-files" / "prenorm-12l" / run
    run_dir.mkdir(parents=True)
    segments = [{"arithmetic": {"fingerprint": {"version": 1, "reference": r, "model": "m"}}} for r in references]
    (run_dir / "manifest.json").write_text(json.dumps({**segments[-1], "segments": segments}))


def test_each_suite_says_whose_arithmetic_its_runs_are_and_how_to_go_on_here(tmp_path, monkeypatch, capsys):
    results = tmp_path / "suites"
    committed_run(results, "placements-12l", "cpu-lr0.001-wf0.25-seed0", "epyc")
    committed_run(results, "placements-12l", "cpu-lr0.002-wf0.25-seed0", "epyc", "xeon")  # resumed on the Xeon
    committed_run(results, "designs-24l", "cpu-lr0.001-wf0.25-seed0", "xeon")
    committed_run(results, "not-a-suite", "cpu-lr0.001-wf0.25-seed0", "xeon")
    probed = []

    def reference(suite):
        probed.append(suite.name)
        return "xeon"

    monkeypatch.setattr(machines, "machine_reference", reference)
    assert machines.main(["--results", str(results)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("designs-24l: xeon (1 runs): this machine's (xeon); go on with: make suite ")
    assert f"--reuse {results / 'designs-24l' / 'run-files'}" in lines[0]
    assert lines[1].startswith("not-a-suite: no suite file of that name")
    assert lines[2] == (
        "placements-12l: epyc (2 runs), xeon (1 runs): mixed, this machine's (xeon) among others: renders only with "
        "--mix-provenance"
    )
    assert probed == ["designs-24l"]  # one probe for every suite at the same profile and arithmetic
    monkeypatch.setattr(machines, "machine_reference", lambda suite: "h100")
    machines.main(["--results", str(results)])
    assert "placements-12l: epyc (2 runs), xeon (1 runs): not this machine's (h100 at the cpu profile)" in (
        capsys.readouterr().out
    )


def test_no_committed_suites_is_said(tmp_path, capsys):
    assert machines.main(["--results", str(tmp_path)]) == 1
    assert f"no <suite>/run-files under {tmp_path}" in capsys.readouterr().err
