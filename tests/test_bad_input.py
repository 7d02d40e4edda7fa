"""Plausible mistakes get a clear message and exit 2 before any work: every numeric option at 0, negative
or absurd; every path missing, a folder or a file where a folder belongs; text that is not UTF-8."""

from __future__ import annotations

import pytest

from tests.smoke import run_cli, smoke_args

NUMBERS = [
    ("--trainer.max_steps=-5", "trainer.max_steps=-5: the optimizer steps"),
    ("--trainer.max_steps=0", "trainer.max_steps=0"),
    ("--trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0: micro-batches"),
    ("--trainer.accumulate_grad_batches=-1", "trainer.accumulate_grad_batches=-1"),
    ("--trainer.val_check_interval=0", "trainer.val_check_interval=0"),
    ("--trainer.val_check_interval=-1", "trainer.val_check_interval=-1"),
    ("--trainer.val_check_interval=1.5", "trainer.val_check_interval=1.5"),
    ("--trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0"),
    ("--trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1"),
    ("--trainer.devices=0", "trainer.devices=0"),
    ("--trainer.devices=-3", "trainer.devices=-3"),
    ("--trainer.num_nodes=0", "trainer.num_nodes=0"),
    ("--trainer.limit_val_batches=-1", "trainer.limit_val_batches=-1"),
    ("--trainer.limit_test_batches=0", "trainer.limit_test_batches=0"),
    ("--data.max_chars=1000", "data.max_chars applies to streamed corpora"),
    ("--trainer.num_sanity_val_steps=-2", "trainer.num_sanity_val_steps=-2"),
    ("--trainer.accelerator=gpu", "asks for a CUDA GPU, and none is usable here"),
    ("--run.checkpoint_every=0", "run.checkpoint_every must be an integer >= 1, got 0"),
    ("--run.checkpoint_every=-1", "run.checkpoint_every must be an integer >= 1"),
    ("--run.dist_timeout_s=0", "run.dist_timeout_s must be an integer >= 1"),
    ("--run.sample_tokens=-1", "run.sample_tokens must be an integer >= 0"),
    ("--run.stop_after_steps=0", "run.stop_after_steps must be a step >= 1"),
    ("--model.divergence.max_skips=0", "divergence.max_skips must be an integer >= 1"),
    ("--model.divergence.factor=0.5", "divergence.factor must be > 1"),
    ("--model.optim.lr=0", "optim.lr must be > 0"),
    ("--model.optim.beta1=2", "optim.beta1 must be in [0, 1)"),
    ("--model.optim.beta2=-1", "optim.beta2 must be in [0, 1)"),
    ("--model.optim.eps=0", "optim.eps must be > 0"),
    ("--model.optim.warmup_fraction=-1", "optim.warmup_fraction must be >= 0"),
    ("--model.optim.warmup_fraction=1", "warmup_fraction 1 reaches the end of the run"),
    ("--model.optim.schedule=step", "unknown schedule 'step'; valid schedules: constant, cosine, wsd"),
    ("--model.optim.min_lr_ratio=2", "optim.min_lr_ratio must be in [0, 1]"),
    ("--model.optim.weight_decay=-1", "optim.weight_decay must be >= 0"),
    ("--model.arch.n_layer=0", "n_layer must be a positive integer"),
    ("--model.arch.n_embd=-1", "n_embd must be a positive integer"),
    ("--model.arch.n_head=3", "must be divisible by n_head"),
    ("--model.arch.dropout=1", "dropout must be in [0, 1)"),
    ("--model.arch.norm_eps=0", "norm_eps"),
    ("--data.vocab_size=0", "vocab_size must be a positive integer"),
    ("--data.vocab_size=100000000", "GiB (3200.1M parameters"),  # absurd: would be killed for memory
    ("--data.block_size=0", "block_size must be a positive integer"),
    ("--data.batch_size=0", "data.batch_size must be >= 1"),
    ("--data.batch_size=100000000", "plus the activations of data.batch_size=100000000"),
    ("--data.num_workers=-1", "data.num_workers must be >= 0"),
    ("--trainer.precision=bogus", "bogus"),
]


def assert_clear_refusal(code: int, err: str, said: str) -> None:
    assert code == 2, err[-2000:]
    assert said in err and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("override, said", NUMBERS, ids=[n for n, _ in NUMBERS])
def test_every_numeric_option_out_of_range_is_refused_before_any_work(tmp_path, smoke_corpus, capsys, override, said):
    root, cache = tmp_path / "runs", tmp_path / "cache"
    code = run_cli(smoke_args(smoke_corpus, f"--run.root={root}", override, cache_dir=cache))
    assert_clear_refusal(code, capsys.readouterr().err, said)
    assert not root.exists() and not cache.exists()  # nothing prepared, nothing written


def test_the_gpu_profile_without_cuda_says_what_to_use(tmp_path, smoke_corpus, capsys):
    args = smoke_args(smoke_corpus, f"--run.root={tmp_path / 'runs'}")
    args[args.index("--profile") + 1] = "gpu"
    assert_clear_refusal(run_cli(args), capsys.readouterr().err, "use PROFILE=cpu, or PROFILE=auto")


def test_bad_paths_and_text_that_is_not_utf8_are_refused(tmp_path, smoke_corpus, capsys):
    latin1 = tmp_path / "latin1"
    latin1.mkdir()
    for i in range(4):
        (latin1 / f"{i}.txt").write_bytes("Caf\xe9 na\xefve fa\xe7ade. ".encode("latin-1") * 50)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        (str(tmp_path / "missing" / "*.txt"), [], "no file matches"),
        (str(latin1), [], "is a folder; give its files"),
        (str(latin1 / "*.txt"), [], "is not UTF-8 text (byte 0xe9 at offset 3); convert it first"),
        (smoke_corpus, [f"--data.cache_dir={a_file}"], "is a file, not a folder"),
        (smoke_corpus, [f"--run.root={a_file}"], "cannot write the run directory"),
        (smoke_corpus, [f"--ckpt_path={tmp_path / 'missing.ckpt'}"], "does not exist"),
        (smoke_corpus, [f"--ckpt_path={tmp_path}"], "is a directory, not a checkpoint: give a .ckpt file, or `last`"),
    ]
    for files, extra, said in cases:
        code = run_cli(smoke_args(files, f"--run.root={tmp_path / 'runs'}", *extra))
        assert_clear_refusal(code, capsys.readouterr().err, said)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["eval", "{tmp}/missing"], "does not exist"),
        (["eval", "{tmp}"], "is not a run directory with checkpoints/last.ckpt"),
        (["eval", "{tmp}", "--devices", "0"], "--devices must be >= 1"),
        (["generate", "{tmp}/missing"], "does not exist"),
        (["generate", "{tmp}", "--tokens", "-1"], "--tokens and --top_k >= 0"),
        (["generate", "{tmp}", "--top_k", "-1"], "--tokens and --top_k >= 0"),
        (["generate", "{tmp}", "--temperature", "0"], "--temperature must be > 0"),
        (["compare", "--jobs", "0"], "--jobs must be >= 1"),
        (["compare", "--lrs", "0"], "every learning rate must be > 0"),
        (["compare", "--warmups", "-1"], "every warmup must be a fraction of the run in [0, 1), got -1"),
        (["compare", "--warmups", "200"], "got 200 (warmups are fractions of the run"),
    ],
)
def test_the_other_commands_refuse_bad_paths_and_numbers(tmp_path, capsys, argv, said):
    from resnorm_lm.cli import main

    try:
        code = main([a.format(tmp=tmp_path) for a in argv])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert_clear_refusal(code, capsys.readouterr().err, said)
