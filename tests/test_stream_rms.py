"""The residual stream's RMS after each block (LayerNorm Scaling's Fig. 1): read by hooks, against a forward
pass run block by block by hand."""

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.train.diagnostics import ReadoutMean, StreamRMS


def model(placement: str, n_layer: int = 4) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=32, placement=placement))


def by_hand(m: GPT, idx: torch.Tensor, pick) -> list[float]:
    """The stream after each block, walking the blocks ourselves; ``pick`` chooses the tensor measured."""
    x = m.wte(idx) + m.wpe(torch.arange(idx.shape[1]))  # (B, T, C)
    stream = m.stream.enter(x)
    rms = []
    for block in m.blocks:
        stream = block(stream)
        rms.append(pick(stream).pow(2).mean().sqrt().item())
    return rms


@pytest.mark.parametrize("placement", ["prenorm", "postnorm", "lns"])
def test_the_recorded_rms_is_that_of_each_blocks_output(placement):
    m = model(placement)
    recorder = StreamRMS(m)
    idx = torch.randint(0, 64, (3, 16))
    with torch.no_grad():
        expected = by_hand(m, idx, lambda s: s)  # the hooks are inactive here: nothing recorded
        assert recorder.take() == []
        recorder.active = True
        m(idx)
    got = [v.item() for v in recorder.take()]
    assert got == pytest.approx(expected, rel=1e-5)
    assert recorder.take() == []  # taken once
    if placement == "postnorm":  # the stream leaving a post-norm block is a LayerNorm's output
        assert got == pytest.approx([1.0] * 4, rel=1e-3)
    if placement == "prenorm":  # nothing renormalizes the stream: it grows from the embeddings' std 0.02
        assert got[-1] > got[0] > 0.02


def test_resi_dual_is_measured_on_its_unnormed_dual_stream():
    m = model("resi_dual")
    recorder = StreamRMS(m)
    recorder.active = True
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        m(idx)
        recorder.active = False
        expected = by_hand(m, idx, lambda s: s[1])
    assert [v.item() for v in recorder.take()] == pytest.approx(expected, rel=1e-5)


def test_the_micro_batches_of_a_step_are_averaged_per_block():
    m = model("prenorm", n_layer=3)
    recorder = StreamRMS(m)
    a, b = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        first, second = by_hand(m, a, lambda s: s), by_hand(m, b, lambda s: s)
        recorder.active = True
        m(a)
        m(b)
    got = [v.item() for v in recorder.take()]
    assert got == pytest.approx([(x + y) / 2 for x, y in zip(first, second)], rel=1e-5)


def test_the_readout_input_is_split_into_the_mean_every_token_shares_and_the_rest():
    """ReadoutMean on the final norm's input: a constant (C,) vector added to the stream before the readout
    shows up in the mean's RMS, and leaves the rest's RMS as it was."""
    m = model("prenorm", n_layer=2)
    recorder = ReadoutMean(m)
    idx = torch.randint(0, 64, (3, 16))
    shift = torch.full((32,), 5.0)  # every token pushed the same way
    with torch.no_grad():
        x = m.wte(idx) + m.wpe(torch.arange(16))
        stream = m.stream.enter(x)
        for block in m.blocks:
            stream = block(stream)  # (B, T, C): the final norm's input, by hand
        recorder.active = True
        m(idx)
        last = m.blocks[-1].register_forward_hook(lambda mod, args, out: out + shift)
        m(idx)
        last.remove()
    mean = stream.mean(dim=(0, 1))
    plain = {
        "readout/mean_rms": mean.pow(2).mean().sqrt().item(),
        "readout/rest_rms": (stream - mean).std(None, correction=0).item(),
    }
    assert {k: v.item() for k, v in recorder.take().items()} == pytest.approx(
        {
            "readout/mean_rms": (plain["readout/mean_rms"] + (mean + shift).pow(2).mean().sqrt().item()) / 2,
            "readout/rest_rms": plain["readout/rest_rms"],
        },
        rel=1e-4,
    )
    assert recorder.take() == {}
