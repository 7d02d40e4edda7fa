"""``resnorm-lm depth-weights``: what AttnRes, Block AttnRes and DenseFormer read, against the weights computed
directly, at init, and from a run directory (and a clear error for a design that mixes no depth)."""

import csv

import pytest
import torch

from resnorm_lm.analysis.depth_weights import attention_readers, dense_readers, main, source_names
from resnorm_lm.analysis.sweep import RunSpec, Setting
from resnorm_lm.model.depth_attention import DenseFormer, DepthAttention
from resnorm_lm.model.gpt import GPT, GPTConfig
from tests.test_depth import DepthTrainer, tiny_run_data


def tiny(placement: str, n_layer: int = 3) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=32, placement=placement)
    return GPT(cfg).eval()


def randomize(model: GPT) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, DepthAttention):
                m.query.normal_(0.0, 0.5)
            if isinstance(m, DenseFormer):
                m.dwa.normal_(0.0, 0.5)


def test_attnres_readers_are_the_depth_attentions_weights_averaged_over_the_tokens():
    model = tiny("attnres")
    randomize(model)
    x = torch.randint(0, 64, (5, 16))
    seen = {}  # module -> its weights (S, B, T), computed on the whole batch at once

    def hook(module, args, output):
        seen[module] = module.weights(args[0]).double()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, DepthAttention)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    readers = attention_readers(model, x, batch_size=2)  # batches of 2, 2 and 1 windows: weighted by tokens
    # 3 blocks: 5 sublayers with a query (the first has none) and the readout, in depth order
    assert [r.name for r in readers] == [
        "block 0 MLP",
        "block 1 attention",
        "block 1 MLP",
        "block 2 attention",
        "block 2 MLP",
        "readout",
    ]
    by_name = {"readout": model.stream.readout, "block 1 attention": model.stream.blocks[1].attn_res}
    for name, module in by_name.items():
        reader = next(r for r in readers if r.name == name)
        assert reader.weights == pytest.approx(seen[module].mean((1, 2)).tolist(), rel=1e-6)
    readout = readers[-1]
    assert readout.sources == source_names(model) and len(readout.sources) == 7  # embeddings and 6 sublayers
    assert sum(readout.shares) == pytest.approx(1.0)
    assert 1.0 < readout.effective_sources() < 7.0  # random queries: neither uniform nor one source


def test_at_init_attnres_reads_the_uniform_average_and_denseformer_its_own_block():
    model = tiny("attnres")
    readers = attention_readers(model, torch.randint(0, 64, (2, 16)))
    for r in readers:
        assert r.weights == pytest.approx([1 / len(r.sources)] * len(r.sources))
        assert r.effective_sources() == pytest.approx(len(r.sources))
    dense = dense_readers(tiny("denseformer"))
    assert [r.name for r in dense] == ["after block 0", "after block 1", "after block 2"]
    assert dense[2].sources == ["embeddings", "block 0", "block 1", "block 2"]
    assert dense[2].weights == [0.0, 0.0, 0.0, 1.0] and dense[2].shares is None


def test_block_attnres_sources_are_the_embeddings_and_the_depth_blocks():
    model = tiny("attnres_block", n_layer=6)  # 12 sublayers in 8 depth-blocks at most: S = 2, 6 depth-blocks
    assert source_names(model) == ["embeddings"] + [f"depth-block {n}" for n in range(1, 7)]
    readers = attention_readers(model, torch.randint(0, 64, (2, 16)))
    assert readers[-1].name == "readout" and len(readers[-1].weights) == 7
    assert all(len(r.weights) <= 7 for r in readers)


@pytest.mark.parametrize("placement", ["attnres-12l", "prenorm-12l"])
def test_the_command_reads_a_run_and_refuses_a_design_without_depth_weights(tmp_path, capsys, placement):
    data = tiny_run_data(tmp_path)
    spec = RunSpec(placement, Setting(1e-3, 0.33), 1, depth=2)
    DepthTrainer(tmp_path / "runs", lambda *a: 5.0, data).train_all([spec])  # an untrained checkpoint
    run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
    code = main([str(run_dir), "--tokens", "40", "--csv", str(tmp_path / "w.csv")])
    captured = capsys.readouterr()
    if placement == "prenorm-12l":
        assert code == 2 and "placement (prenorm) has no depth weights" in captured.err
        assert not (tmp_path / "w.csv").exists()
        return
    assert code == 0 and "| readout | 5 | 0.20 | 0.20 |" in captured.out  # zero queries: uniform over 5
    rows = list(csv.DictReader((tmp_path / "w.csv").open()))
    readout = [r for r in rows if r["reader"] == "readout"]
    assert [r["source"] for r in readout][:2] == ["embeddings", "block 0 attention"]
    assert sum(float(r["magnitude_share"]) for r in readout) == pytest.approx(1.0)


def test_the_command_says_what_is_wrong_with_a_missing_run(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "depth-weights: error:" in capsys.readouterr().err
