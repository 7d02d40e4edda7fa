"""eval, compare and generate on smoke runs over a local corpus (offline, CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import resnorm_lm.train.precision
from resnorm_lm.analysis.compare import markdown_report
from resnorm_lm.analysis.sweep import eval_precisions, evaluated
from resnorm_lm.analysis.trained_run import eval_precision, format_tables
from resnorm_lm.cli import main
from tests.smoke import resnorm_lm_process, run_cli, run_cli_captured, smoke_args, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory, smoke_corpus, recipe_run):
    """Two finished smoke runs (prenorm, postnorm-triton: the session's), one with another vocabulary, one on
    another text."""
    tmp = tmp_path_factory.mktemp("trained")
    assert run_cli(smoke_args(smoke_corpus, f"--run.root={tmp / 'other'}", "--data.vocab_size=300")) == 0
    other_corpus = write_corpus(tmp / "corpus2", seed=1)
    assert run_cli(smoke_args(other_corpus, f"--run.root={tmp / 'other_text'}")) == 0
    return {
        "tmp": tmp,
        "corpus": smoke_corpus,
        "pre": recipe_run("prenorm-12l"),
        "post": recipe_run("postnorm-12l-triton"),
        "other_vocab": tmp / "other" / "prenorm-12l" / "smoke-seed1",
        "other_text": tmp / "other_text" / "prenorm-12l" / "smoke-seed1",
    }


def copied_run(trained, dest: Path, run: str = "pre", files: str | None = None, precision: str | None = None) -> Path:
    """A copy of a trained run (the prenorm one by default) for a test to evaluate, so that no test reads what
    another's evaluation wrote into eval.json; its checkpoint may name other text files or another precision."""
    shutil.copytree(trained[run], dest)
    ckpt = dest / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)
    if files is not None:
        state["datamodule_hyper_parameters"]["files"] = [files]
    if precision is not None:
        state["precision"] = precision
    torch.save(state, ckpt)
    return dest


def test_eval_counts_every_token_once_and_records_it(trained, tmp_path, capsys):
    pre, post = copied_run(trained, tmp_path / "pre"), copied_run(trained, tmp_path / "post", run="post")
    assert main(["eval", str(pre), str(post)]) == 0
    out = capsys.readouterr().out
    assert "| run | step |" in out and "validation_ppl" in out and "test_bpb" in out
    summary = json.loads((pre / "eval.json").read_text())["eval"]
    for split in ("validation", "test"):
        metrics = summary[split]
        assert metrics["targets"] == metrics["tokens"] - 1  # every token but the first is predicted once
        assert metrics["ppl"] == pytest.approx(torch.tensor(metrics["loss"]).exp().item(), rel=1e-5)
        assert metrics["bpb"] > 0 and metrics["word_ppl"] > metrics["ppl"]
    assert summary["step"] == 2  # the run's last step


def validation_loss(run: Path) -> float:
    return json.loads((run / "eval.json").read_text())["eval"]["validation"]["loss"]


def test_eval_is_deterministic(trained, tmp_path):
    run = copied_run(trained, tmp_path / "run")
    assert main(["eval", str(run), "--split", "validation"]) == 0
    first = validation_loss(run)
    assert main(["eval", str(run), "--split", "validation"]) == 0
    assert validation_loss(run) == first


def test_runs_with_different_tokenizers_on_one_text_keep_bpb_and_word_ppl(trained, tmp_path, capsys):
    runs = [copied_run(trained, tmp_path / name, run=name) for name in ("pre", "other_vocab")]
    assert main(["eval", *map(str, runs), "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "use 2 tokenizers: token-level perplexity counts different tokens" in out
    header = next(line for line in out.splitlines() if line.startswith("| run |"))
    assert "validation_ppl" not in header and "validation_bpb" in header and "validation_word_ppl" in header
    assert out.count("| run |") == 1  # one text: one table, both runs ranked in it


def test_runs_on_different_texts_are_ranked_only_within_their_own_text(trained, tmp_path, capsys):
    pre, other_text, post = (str(copied_run(trained, tmp_path / n, run=n)) for n in ("pre", "other_text", "post"))
    assert main(["eval", pre, other_text, post, "--split", "validation"]) == 0
    out = capsys.readouterr().out
    assert "evaluated on 2 different texts" in out and "not ranked against each other" in out
    tables = out.split("corpus text (fingerprint ")[1:]
    assert len(tables) == 2 and out.count("| run |") == 2
    # one tokenizer within each text: token-level perplexity is kept there
    assert all("validation_ppl" in t and "validation_word_ppl" in t for t in tables)
    first = next(t for t in tables if pre in t)
    assert post in first and other_text not in first


def test_the_table_ranks_by_bpb_within_each_text_and_never_across():
    def row(name, corpus, bpb, tokenizer="t1"):
        return {
            "run": name,
            "corpus": "text",
            "corpus_fingerprint": corpus,
            "tokenizer": tokenizer,
            "validation_bpb": bpb,
            "validation_ppl": 2**bpb,
            "validation_word_ppl": 3**bpb,
        }

    rows = [row("a-worse", "A", 3.0), row("b", "B", 2.5), row("a-better", "A", 2.0, tokenizer="t2")]
    text = format_tables(rows, "validation")
    first, second = text.split("corpus text (fingerprint B)")
    assert first.index("a-better") < first.index("a-worse") and "| b |" not in first  # ranked within A only
    assert "validation_ppl" not in first.splitlines()[2]  # A has two tokenizers: no token-level perplexity
    assert "validation_word_ppl" in first and "validation_ppl" in second  # B: one tokenizer, all kept
    assert "corpus" not in format_tables(rows[:1], "validation")  # one text: one plain table


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", None])
def test_eval_refuses_corrupt_truncated_or_foreign_checkpoints(trained, tmp_path, capsys, content):
    bad = tmp_path / "bad.ckpt"
    if content is None:  # a truncated real checkpoint
        data = (trained["pre"] / "checkpoints" / "last.ckpt").read_bytes()
        content = data[: len(data) // 2]
    bad.write_bytes(content)
    assert main(["eval", str(bad)]) == 2
    assert "corrupt, truncated or not a checkpoint" in capsys.readouterr().err
    torch.save({"state_dict": {}, "hyper_parameters": {}}, bad)
    assert main(["eval", str(bad)]) == 2
    assert "not a resnorm-lm checkpoint" in capsys.readouterr().err


def test_eval_over_two_ddp_processes_matches_one(trained, tmp_path):
    run = copied_run(trained, tmp_path / "run")
    assert main(["eval", str(run), "--split", "validation"]) == 0
    single = validation_loss(run)
    proc = resnorm_lm_process(["eval", str(run), "--devices", "2", "--split", "validation"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads((run / "eval.json").read_text())["eval"]["validation"]
    assert both["targets"] == both["tokens"] - 1  # each target counted once across the two ranks
    assert both["loss"] == pytest.approx(single, rel=1e-5)


def test_generate_streams_a_deterministic_sample_for_each_backend(trained, capsys):
    texts = []
    for run in (trained["pre"], trained["post"], trained["pre"]):
        assert main(["generate", str(run), "--prompt", "The king", "--tokens", "20", "--seed", "3"]) == 0
        texts.append(capsys.readouterr().out)
    assert all(t.startswith("The king") and len(t) > len("The king") + 5 for t in texts)
    assert texts[0] == texts[2]  # same seed, same text


def test_compare_trains_missing_resumes_unfinished_and_reuses_finished(tmp_path, smoke_corpus):
    root, results = tmp_path / "runs", tmp_path / "results"
    train_args = f"--data.corpus=text --data.files=[{smoke_corpus}] --trainer.enable_progress_bar=false"
    # an unfinished run (stopped at step 3 of 6) and two finished ones, in the directories compare gives them
    assert (
        run_cli(smoke_args(smoke_corpus, f"--run.root={root}", "--run.stop_after_steps=3", recipe="postnorm-12l")) == 0
    )
    for seed in (1, 2):
        assert run_cli(smoke_args(smoke_corpus, f"--run.root={root}", f"--seed_everything={seed}")) == 0
    args = [
        "compare",
        "--recipes",
        "prenorm-12l",
        "postnorm-12l",
        "--profile",
        "smoke",
        "--seeds",
        "1",
        "2",
        "--root",
        str(root),
        "--results",
        str(results),
        f"--train-args={train_args}",
    ]
    proc = run_cli_captured(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming postnorm-12l (smoke, recipe lr, warmup of the recipe, seed 1)" in proc.stdout
    assert proc.stdout.count("compare: training") == 1 and "training postnorm-12l" in proc.stdout  # seed 2
    table = (results / "smoke" / "compare.md").read_text()
    assert "| prenorm-12l | - | - | 2 |" in table and "| postnorm-12l |" in table and " ± " in table
    assert "| eval precision | status |" in table and "| 32-true |" in table  # the smoke runs trained in fp32
    rows = (results / "smoke" / "compare.csv").read_text().splitlines()
    assert rows[0].startswith("recipe,") and "eval_precision" in rows[0] and len(rows) == 3
    assert (results / "smoke" / "loss_curves.png").stat().st_size > 10_000
    assert (results / "smoke" / "grad_norms.png").stat().st_size > 10_000
    again = run_cli_captured(args)
    assert again.returncode == 0 and "compare: training" not in again.stdout and "resuming" not in again.stdout


def test_compare_rejects_unknown_recipes(capsys):
    assert main(["compare", "--recipes", "prenorm-99l", "--profile", "smoke"]) == 2
    assert "unknown recipe 'prenorm-99l'" in capsys.readouterr().err


def test_eval_and_generate_refuse_a_run_whose_text_corpus_changed(trained, tmp_path, capsys, data_cache):
    corpus = tmp_path / "corpus"
    shutil.copytree(Path(trained["corpus"]).parent, corpus)
    run = copied_run(trained, tmp_path / "run", files=str(corpus / "*.txt"))
    assert main(["eval", str(run), "--split", "validation"]) == 0  # the same text elsewhere: the same data
    recorded = (run / "eval.json").read_bytes()
    cache = data_cache
    cached = {sub: sorted((cache / sub).iterdir()) for sub in ("prepared", "tokenizers")}
    first = sorted(corpus.glob("*.txt"))[0]
    first.write_text(first.read_text() + "A line the run never saw.\n")
    capsys.readouterr()
    for command in ("eval", "generate"):
        assert main([command, str(run)]) == 2
        err = capsys.readouterr().err
        assert f"resnorm-lm {command}: error: {run / 'checkpoints' / 'last.ckpt'} was trained on other data" in err
        assert "corpus_fingerprint: checkpoint " in err and "restore the corpus it was trained on" in err
    assert (run / "eval.json").read_bytes() == recorded  # nothing merged
    # refused before a tokenizer was trained on the changed text or any token bin written
    assert {sub: sorted((cache / sub).iterdir()) for sub in ("prepared", "tokenizers")} == cached


def test_eval_and_generate_of_a_run_whose_files_moved_say_so(trained, tmp_path, capsys):
    run = copied_run(trained, tmp_path / "run", files=str(tmp_path / "moved" / "*.txt"))
    recorded = (run / "eval.json").read_bytes()
    for command in ("eval", "generate"):
        assert main([command, str(run)]) == 2
        err = capsys.readouterr().err
        assert "cannot prepare the data" in err and "data.files: no file matches" in err
        assert "Put the data back where it was trained from" in err
    assert (run / "eval.json").read_bytes() == recorded


def test_eval_scores_a_run_at_its_training_precision_and_records_it(trained, tmp_path, monkeypatch, capsys):
    bf16_here = resnorm_lm.train.precision.PrecisionChoice("bf16-mixed", "as on a CPU with fast native bf16")
    monkeypatch.setattr(resnorm_lm.train.precision, "choose_auto", lambda cuda, measure=False: bf16_here)
    run = copied_run(trained, tmp_path / "run")
    assert main(["eval", str(run), "--split", "validation"]) == 0
    assert "| 32-true |" in capsys.readouterr().out  # the table says so
    default = json.loads((run / "eval.json").read_text())["eval"]
    assert default["precision"] == default["trained_precision"] == "32-true"
    assert main(["eval", str(run), "--split", "validation", "--precision", "32-true"]) == 0
    fp32 = json.loads((run / "eval.json").read_text())["eval"]
    assert fp32["validation"]["loss"] == default["validation"]["loss"]
    assert main(["eval", str(run), "--split", "test", "--precision", "bf16-mixed"]) == 0
    bf16 = json.loads((run / "eval.json").read_text())["eval"]
    assert bf16["precision"] == "bf16-mixed" and "validation" not in bf16  # fp32 numbers are not mixed in
    assert main(["eval", str(run), "--split", "test", "--precision", "auto"]) == 0
    assert json.loads((run / "eval.json").read_text())["eval"]["test"]["loss"] == bf16["test"]["loss"]
    assert main(["eval", str(run), "--split", "test"]) == 0
    assert json.loads((run / "eval.json").read_text())["eval"]["test"]["loss"] != bf16["test"]["loss"]


def test_a_16_mixed_run_is_evaluated_in_fp32_on_cpu_and_says_so(trained, tmp_path, capsys):
    run = copied_run(trained, tmp_path / "run", precision="16-mixed")
    assert main(["eval", str(run), "--split", "validation"]) == 0
    assert "precision 32-true (fp32: the run trained in 16-mixed, which needs a CUDA GPU)" in capsys.readouterr().err
    ev = json.loads((run / "eval.json").read_text())["eval"]
    assert ev["precision"] == "32-true" and ev["trained_precision"] == "16-mixed"
    assert eval_precision("run", None, cuda=False).precision == "32-true"  # unknown: fp32, said in the reason


def test_compare_measures_again_what_was_evaluated_at_another_precision(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "last.ckpt"

    def record(**precision):
        ev = {"step": 6, "validation": {"loss": 5.0}, **precision}
        (run / "eval.json").write_text(json.dumps({"step": 6, "finished": True, "eval": ev}))

    ckpt.write_bytes(b"weights")
    record(precision="bf16-mixed", trained_precision="32-true")  # how the published tables were evaluated
    assert evaluated(run, "validation") is None  # measured again, at the run's 32-true
    assert evaluated(run, "validation", "bf16-mixed") == {"loss": 5.0}
    record(precision="32-true", trained_precision="32-true")
    assert evaluated(run, "validation") == {"loss": 5.0}
    assert evaluated(run, "validation", "32-true") == {"loss": 5.0}
    record()  # written before the precision was recorded
    assert evaluated(run, "validation") is None
    ckpt.unlink()  # without the checkpoint the numbers are used as recorded, and the tables say so
    assert evaluated(run, "validation") == {"loss": 5.0}
    assert eval_precisions([run]) == "not recorded"
    row = {
        "recipe": "prenorm-12l",
        "lr": 1e-3,
        "warmup": 200,
        "n_seeds": 1,
        "n_runs": 1,
        "train_s": 1.0,
        "val_loss_mean": 5.0,
        "eval_precision": "32-true",
        "status": "ok",
    }
    assert "| 32-true | ok |" in markdown_report([row], [], "cpu", "make compare", 6.4, "a CPU")
