"""``resnorm-lm export``: weights out of a checkpoint as safetensors, read back by transformers where it has the
architecture (GPT-2 for pre-norm, OPT for post-norm) and by this package everywhere, without pickle."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from resnorm_lm.model import exported
from resnorm_lm.model.decoding import sample_tokens
from resnorm_lm.model.gpt import GPT, GPTConfig
from tests.smoke import run_cli, run_cli_captured
from tests.tolerances import assert_within_noise

transformers = pytest.importorskip("transformers")  # a dev dependency: make install has it

SMALL = GPTConfig(vocab_size=97, block_size=16, n_layer=3, n_head=2, n_embd=32)


def scrambled(cfg: GPTConfig, seed: int = 0) -> GPT:
    """A GPT whose every parameter is random and of order one (norm gains and biases included, which a fresh
    model has at 1 and 0): a layout that forgot or swapped a tensor changes the logits visibly."""
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.5) + (p.dim() == 1) * 0.5)
    return model.eval()


def write_export(model: GPT, folder: Path) -> str:
    layout, files = exported.files(model, eot_id=0, extra={})
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return layout


def logits_of(model, idx: torch.Tensor) -> torch.Tensor:
    out = model(idx)
    return (out.logits if hasattr(out, "logits") else out[0]).detach()


IDS = torch.randint(0, SMALL.vocab_size, (2, SMALL.block_size), generator=torch.Generator().manual_seed(1))

TRANSFORMERS_LAYOUTS = [
    pytest.param(SMALL, "gpt2", id="prenorm-gpt2"),
    pytest.param(replace(SMALL, bias=False, tie_embeddings=False), "gpt2", id="prenorm-nobias-untied-gpt2"),
    pytest.param(replace(SMALL, placement="postnorm"), "opt", id="postnorm-opt"),
    pytest.param(replace(SMALL, placement="postnorm", bias=False, tie_embeddings=False), "opt", id="postnorm-opt-2"),
]


@pytest.mark.parametrize(("cfg", "layout"), TRANSFORMERS_LAYOUTS)
def test_transformers_computes_the_exported_models_logits(tmp_path, cfg, layout):
    model = scrambled(cfg)
    assert write_export(model, tmp_path) == layout
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(theirs).__name__ == {"gpt2": "GPT2LMHeadModel", "opt": "OPTForCausalLM"}[layout]
    with torch.no_grad():
        exact = logits_of(scrambled(cfg).double(), IDS)
        ours, got = logits_of(model, IDS), logits_of(theirs, IDS)
    assert got.shape == ours.shape == (2, cfg.block_size, cfg.vocab_size)
    # transformers sums in another order (GPT-2's Conv1D is addmm on transposed weights): within the noise of
    # this package's own fp32 forward, against fp64
    assert_within_noise(got, ours, exact, what=f"{layout} logits", terms=4 * cfg.n_embd)


@pytest.mark.parametrize(("cfg", "layout"), TRANSFORMERS_LAYOUTS[::2])
def test_transformers_greedy_decoding_is_this_packages(tmp_path, cfg, layout):
    model = scrambled(cfg, seed=3)
    write_export(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    prompt = torch.tensor([0, 5, 7])
    ours = list(sample_tokens(model, prompt, max_new_tokens=10, greedy=True))
    with torch.no_grad():
        # the prompt starts with end-of-text, which is the pad token too: the mask says it is read
        ids, mask = prompt.view(1, -1), torch.ones(1, len(prompt), dtype=torch.long)
        out = theirs.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert out[0, 3:].tolist() == ours


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param(replace(SMALL, placement="sandwich", norm="rmsnorm"), id="sandwich-rmsnorm"),
        pytest.param(replace(SMALL, placement="deepnorm", tie_embeddings=False), id="deepnorm-untied"),
        pytest.param(replace(SMALL, placement="postnorm", norm_eps=1e-6), id="postnorm-eps1e-6"),
        pytest.param(SMALL, id="prenorm-gpt2"),
        pytest.param(replace(SMALL, placement="olmo2", norm="rmsnorm", qk_norm="full"), id="olmo2-qknorm"),
        pytest.param(replace(SMALL, norm="derf", bias=False), id="prenorm-derf"),
    ],
)
def test_every_model_reads_back_exactly(tmp_path, cfg):
    model = scrambled(cfg)
    write_export(model, tmp_path)
    again, meta = exported.load_model(tmp_path)
    assert again.config == cfg
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    assert torch.equal(logits_of(again.eval(), IDS), logits_of(model, IDS))


def test_a_model_transformers_has_no_architecture_for_says_why(tmp_path):
    layout, why = exported.layout_for(replace(SMALL, placement="postnorm", norm_eps=1e-6))
    assert layout == "resnorm_lm" and "eps 1e-5" in why
    layout, why = exported.layout_for(replace(SMALL, norm="rmsnorm"))
    assert layout == "resnorm_lm" and "'rmsnorm'" in why
    layout, why = exported.layout_for(replace(SMALL, qk_norm="per_head"))  # GPT-2 has no QK-norm
    assert layout == "resnorm_lm" and "qk_norm 'per_head'" in why
    write_export(scrambled(replace(SMALL, norm="rmsnorm")), tmp_path)
    assert not (tmp_path / exported.HF_CONFIG).exists()  # transformers would read the weights as another model's


def test_a_folder_that_is_not_an_export_or_is_damaged_is_refused_clearly(tmp_path):
    with pytest.raises(exported.ExportError, match="not a resnorm-lm export"):
        exported.read(tmp_path)
    write_export(scrambled(SMALL), tmp_path)
    config = json.loads((tmp_path / exported.CONFIG).read_text())
    config["arch"]["n_layer"] = 4
    (tmp_path / exported.CONFIG).write_text(json.dumps(config))
    with pytest.raises(exported.ExportError, match="does not hold this export's weights"):
        exported.load_model(tmp_path)  # the gpt2 layout has no tensors for a 4th block
    own = tmp_path / "own"
    write_export(scrambled(replace(SMALL, norm="rmsnorm")), own)
    config = json.loads((own / exported.CONFIG).read_text())
    config["arch"]["n_embd"] = 64
    (own / exported.CONFIG).write_text(json.dumps(config))
    with pytest.raises(exported.ExportError, match="do not fit the architecture"):
        exported.load_model(own)
    weights = tmp_path / exported.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(exported.ExportError, match="does not hold"):
        exported.read(tmp_path)


# ---------------------------------------------------------------- the command, on a trained run


@pytest.fixture(scope="module")
def export_of(recipe_run, tmp_path_factory):
    folders = {}

    def export(recipe: str) -> Path:
        if recipe not in folders:
            folder = tmp_path_factory.mktemp("exports") / recipe
            done = run_cli_captured(["export", str(recipe_run(recipe)), str(folder)])
            assert done.returncode == 0, done.stderr
            folders[recipe] = folder
        return folders[recipe]

    return export


@pytest.mark.parametrize(("recipe", "layout"), [("prenorm-12l", "gpt2"), ("postnorm-12l", "opt")])
def test_an_exported_run_evaluates_as_its_checkpoint(recipe_run, export_of, tmp_path, recipe, layout):
    folder = export_of(recipe)
    assert json.loads((folder / exported.CONFIG).read_text())["layout"] == layout
    table = {}
    for what, path in (("checkpoint", recipe_run(recipe)), ("export", folder)):
        assert run_cli(["eval", str(path), "--split", "validation", "--csv", str(tmp_path / f"{what}.csv")]) == 0
        with open(tmp_path / f"{what}.csv") as f:
            table[what] = [row for row in csv.DictReader(f)]
    for column in ("validation_loss", "validation_bpb", "validation_tokens"):
        assert table["export"][0][column] == table["checkpoint"][0][column], column


def test_an_exported_run_generates_as_its_checkpoint(recipe_run, export_of):
    args = ["--prompt", "To be", "--tokens", "12", "--greedy"]
    from_run = run_cli_captured(["generate", str(recipe_run("prenorm-12l")), *args])
    from_export = run_cli_captured(["generate", str(export_of("prenorm-12l")), *args])
    assert from_run.returncode == from_export.returncode == 0, from_export.stderr
    assert from_export.stdout == from_run.stdout and from_run.stdout.startswith("To be")


def test_transformers_tokenizes_the_validation_text_as_the_run_did(export_of):
    from resnorm_lm.train.loaded_run import load_run

    folder = export_of("prenorm-12l")
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    data = load_run(folder).datamodule
    ours, eot = data.prepared.tokenizer, data.manifest.eot_id
    assert theirs.eos_token_id == eot
    tokens = data.prepared.tokens("validation").tolist()  # the split as the run read it: documents and end-of-text
    documents, start = [], 0
    for i, token in enumerate([*tokens, eot]):
        if token == eot:
            documents += [tokens[start:i]] if i > start else []
            start = i + 1
    assert len(documents) >= 1 and sum(map(len, documents)) + tokens.count(eot) == len(tokens)
    for ids in documents:
        text = theirs.decode(ids)
        assert text == ours.decode(ids, skip_special_tokens=False)
        assert theirs(text)["input_ids"] == ids  # the text back to the very ids the run was scored on


def test_the_export_command_refuses_a_folder_that_holds_something_else(recipe_run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = run_cli_captured(["export", str(recipe_run("prenorm-12l")), str(tmp_path)])
    assert done.returncode == 2 and "not an export" in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_run_starts_from_an_export(recipe_run, export_of):
    from resnorm_lm.train.lightning_module import LanguageModel

    folder = export_of("prenorm-12l")
    gpt, _ = exported.load_model(folder)
    model = LanguageModel(arch=gpt.config, init_from=str(folder))
    for name, tensor in gpt.state_dict().items():
        assert torch.equal(model.model.state_dict()[name], tensor), name
    n = gpt.config.n_layer
    with pytest.raises(exported.ExportError, match=f"n_layer: export {n}, this run {n + 1}"):
        LanguageModel(arch=replace(gpt.config, n_layer=n + 1), init_from=str(folder))


@pytest.fixture(scope="module")
def trained_export(smoke_corpus, tmp_path_factory):
    """``recipe`` trained 40 steps on the smoke profile (far enough from its init that the next token is rarely a
    near-tie) and exported: (run directory, export folder)."""
    from tests.smoke import smoke_args

    root, made = tmp_path_factory.mktemp("trained"), {}

    def make(recipe: str) -> tuple[Path, Path]:
        if recipe not in made:
            args = ["--trainer.max_steps=40", "--trainer.val_check_interval=40", "--model.optim.lr=3e-3"]
            done = run_cli_captured(smoke_args(smoke_corpus, f"--run.root={root}", *args, recipe=recipe))
            assert done.returncode == 0, done.stderr[-2000:]
            run_dir, folder = root / recipe / "smoke-seed1", root / "exports" / recipe
            assert run_cli(["export", str(run_dir), str(folder)]) == 0
            made[recipe] = run_dir, folder
        return made[recipe]

    return make


@pytest.mark.parametrize("recipe", ["prenorm-12l", "postnorm-12l"])
def test_transformers_gives_a_trained_runs_logits_and_greedy_text(trained_export, recipe):
    run_dir, folder = trained_export(recipe)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours, _ = exported.load_model(folder)
    prompt = "To be, or not"
    ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(prompt)["input_ids"]]])  # (1, T): as generate starts
    with torch.no_grad():
        want, got = logits_of(ours.eval(), ids), logits_of(theirs, ids)
        exact = logits_of(exported.load_model(folder)[0].double().eval(), ids)
    assert_within_noise(got, want, exact, what=f"{recipe} logits", terms=4 * ours.config.n_embd)

    new = 24
    with torch.no_grad():
        path = ids
        for _ in range(new):  # our greedy path, with how far each pick is ahead of the next-best token
            top2 = logits_of(ours, path)[0, -1].topk(2).values
            assert top2[0] - top2[1] > 1e-4, "a near-tie: the comparison would test rounding, not the model"
            path = torch.cat([path, logits_of(ours, path)[:, -1:].argmax(-1)], dim=1)
        mask = torch.ones_like(ids)
        out = theirs.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None)
    assert out[0].tolist() == path[0].tolist()
    text = prompt + tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)
    shown = run_cli_captured(["generate", str(run_dir), "--prompt", prompt, "--tokens", str(new), "--greedy"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == text + "\n"
