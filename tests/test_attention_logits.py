"""``resnorm-lm attention-logits``: each attention's largest logit and its heads' entropy, checked against cases
with a known answer (uniform attention, the bound QK-norm sets, logits that scale with the query weights) and
against attention computed by hand; and the command on a run directory, with a clear error where there is none."""

import csv
import math

import pytest
import torch
import torch.nn.functional as F

from resnorm_lm.analysis.attention_logits import logits_and_entropy, main, measure, recorded_queries_keys
from resnorm_lm.analysis.sweep import RunSpec, Setting
from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.targets import IGNORE_INDEX
from resnorm_lm.train.diagnostics import AttentionLogitMax
from tests.test_depth import DepthTrainer, tiny_run_data

C, HEADS, T = 32, 2, 8


def tiny(qk_norm: str = "none", norm_eps: float = 1e-5) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=T, n_layer=2, n_head=HEADS, n_embd=C, qk_norm=qk_norm, norm_eps=norm_eps)
    return GPT(cfg).eval()


def query_rows(model: GPT) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each attention's query weight rows and bias, (C, C) and (C,)."""
    return [(b.attn.c_attn.weight[:C], b.attn.c_attn.bias[:C]) for b in model.blocks]


def test_uniform_attention_has_the_entropy_of_a_uniform_row_and_zero_logits():
    model = tiny()
    with torch.no_grad():
        for w, b in query_rows(model):
            w.zero_(), b.zero_()  # q = 0: every logit 0, each row uniform over its i + 1 keys
    x = torch.randint(0, 64, (3, T))
    y = torch.randint(0, 64, (3, T))
    y[2, 5:] = IGNORE_INDEX  # positions 5..7 of the last window are not counted
    blocks = measure(model, x, y, batch_size=2)
    counted = [i for _ in range(2) for i in range(T)] + list(range(5))
    expected = sum(math.log(i + 1) for i in counted) / len(counted)
    assert len(blocks) == 2
    for block in blocks:
        assert block.max_abs_logit == 0.0
        assert block.head_entropy == pytest.approx([expected] * HEADS)


def test_the_logits_are_those_the_attention_computed():
    """Softmax of the recorded logits times the values, projected, is the attention's own output."""
    model = tiny()
    with torch.no_grad():
        for w, _ in query_rows(model):
            w.mul_(8.0)  # sharper attention than at init
    x = torch.randint(0, 64, (2, T))
    outputs = {}
    attn = model.blocks[1].attn
    handle = attn.register_forward_hook(lambda m, args, out: outputs.update(x=args[0], y=out))
    with torch.no_grad(), recorded_queries_keys(model) as records:
        model(x)
    handle.remove()
    q, k = records[1]  # (B, T, C)
    v = attn.c_attn(outputs["x"])[..., 2 * C :]
    heads = lambda t: t.view(2, T, HEADS, C // HEADS).transpose(1, 2)  # noqa: E731
    z = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(C // HEADS)  # (B, nh, T, T)
    z = z.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    by_hand = attn.c_proj((z.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, T, C))
    torch.testing.assert_close(by_hand, outputs["y"], rtol=1e-5, atol=1e-6)
    blocks = measure(model, x, torch.zeros_like(x))
    assert blocks[1].max_abs_logit == pytest.approx(z[torch.isfinite(z)].abs().max().item(), rel=1e-6)


def test_logits_grow_with_the_query_weights_without_qk_norm_and_not_with_it():
    x = torch.randint(0, 64, (2, T))
    y = torch.zeros_like(x)
    for qk_norm in ("none", "full", "per_head"):
        model = tiny(qk_norm, norm_eps=1e-12)  # an RMSNorm's eps would leave a trace of the scale
        before = [b.max_abs_logit for b in measure(model, x, y)]
        w, b = query_rows(model)[-1]
        with torch.no_grad():
            w.mul_(10.0), b.mul_(10.0)  # the last attention's q -> 10 q exactly; what comes before is unchanged
        after = [b.max_abs_logit for b in measure(model, x, y)]
        assert after[0] == before[0]
        if qk_norm == "none":
            assert after[1] == pytest.approx(10 * before[1], rel=1e-5)
        else:  # an RMSNorm of q: the scale is gone (its eps too small to leave a trace)
            assert after[1] == pytest.approx(before[1], rel=1e-6)
        if qk_norm == "per_head":  # unit-gain RMSNorm per head: |q.k| / sqrt(hs) <= |q||k| / sqrt(hs) = sqrt(hs)
            assert max(after) <= math.sqrt(C // HEADS) + 1e-9


def test_the_command_reads_a_run_and_writes_each_block(tmp_path, capsys):
    data = tiny_run_data(tmp_path)
    spec = RunSpec("prenorm-12l-qknorm-head", Setting(1e-3, 0.33), 1, depth=2)
    DepthTrainer(tmp_path / "runs", lambda *a: 5.0, data).train_all([spec])  # an untrained checkpoint
    run_dir = spec.run_dir(str(tmp_path / "runs"), "smoke")
    assert main([str(run_dir), "--tokens", "40", "--csv", str(tmp_path / "l.csv")]) == 0
    out = capsys.readouterr().out
    assert "| per_head |" in out and "Attention logits on 40 validation targets" in out
    rows = list(csv.DictReader((tmp_path / "l.csv").open()))
    assert [r["block"] for r in rows] == ["0", "1"]
    head_dim = 32 // 2  # the smoke profile's width and heads
    assert all(0 < float(r["max_abs_logit"]) <= math.sqrt(head_dim) for r in rows)
    assert all(0 < float(r["lowest_head_entropy"]) <= float(r["mean_entropy"]) for r in rows)


def test_the_command_says_what_is_wrong(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "attention-logits: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--tokens", "0"])


def test_sdpa_and_the_recorded_logits_agree_under_qk_norm():
    model = tiny("full")
    x = torch.randint(0, 64, (1, T))
    with torch.no_grad(), recorded_queries_keys(model) as records:
        model(x)
    q, k = records[0]
    heads = lambda t: t.view(1, T, HEADS, C // HEADS).transpose(1, 2)  # noqa: E731
    ones = torch.eye(T).expand(1, HEADS, T, T)  # values = one-hot positions: SDPA returns its weights
    weights = F.scaled_dot_product_attention(heads(q), heads(k), ones, is_causal=True)
    z = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(C // HEADS)
    torch.testing.assert_close(
        weights, z.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf).softmax(-1)
    )


@pytest.mark.parametrize(
    "qk_norm, at_init", [("none", math.inf), ("per_head", math.sqrt(C // HEADS)), ("full", C / math.sqrt(C // HEADS))]
)
def test_each_qk_norms_cap_bounds_its_logits_and_is_reached_on_one_coordinate(qk_norm, at_init):
    """``logit_cap``: sqrt(head_dim) * max |g_q g_k| per head, C / sqrt(head_dim) * max |g_q g_k| over all heads
    (at init sqrt(head_dim) and C / sqrt(head_dim)); random queries and keys stay under it at learned gains, and
    queries and keys that put all their weight on the coordinate of the largest gains reach it."""
    model = tiny(qk_norm, norm_eps=1e-12)
    blocks = measure(model, torch.randint(0, 64, (2, T)), torch.zeros(2, T, dtype=torch.long))
    assert [b.cap for b in blocks] == pytest.approx([at_init] * 2)
    if qk_norm == "none":
        return
    norm = model.blocks[0].attn.qk_norm
    with torch.no_grad():  # the norms' weights require grad
        norm.q_norm.weight.uniform_(0.5, 2.0), norm.k_norm.weight.uniform_(-2.0, 2.0)
        hs, counted = C // HEADS, torch.ones(1, T, dtype=torch.bool)
        gains = (norm.q_norm.weight * norm.k_norm.weight).abs()
        assert norm.logit_cap() == pytest.approx(gains.max().item() * at_init)
        largest, _ = logits_and_entropy(*norm(torch.randn(1, T, C) * 30, torch.randn(1, T, C) * 30), HEADS, counted)
        assert 0 < largest < norm.logit_cap()
        i = int(gains.argmax()) % hs if qk_norm == "per_head" else int(gains.argmax())  # per head: the shared gains
        one_hot = torch.zeros(1, T, C)
        one_hot[..., i] = 3.0  # every position: all of q and k on coordinate i (of every head, per head)
        largest, _ = logits_and_entropy(*norm(one_hot, one_hot), HEADS, counted)
        assert largest == pytest.approx(norm.logit_cap(), rel=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# The same largest logit logged as training goes (``AttentionLogitMax``, ``attn_logit_max/layer_XX`` in metrics.csv)


@pytest.mark.parametrize("qk_norm", ["none", "full", "per_head"])
def test_the_logged_largest_logit_is_the_commands_on_the_same_batch(qk_norm):
    model = tiny(qk_norm)
    with torch.no_grad():
        for w, _ in query_rows(model):
            w.mul_(4.0)  # logits well away from 0
    recorder = AttentionLogitMax(model)
    x = torch.randint(0, 64, (3, T))
    with torch.no_grad():
        model(x)
        assert recorder.take() == []  # inactive: nothing recorded
        recorder.active = True
        model(x)
        recorder.active = False
    got = [v.item() for v in recorder.take()]
    assert recorder.take() == []  # taken once
    expected = [b.max_abs_logit for b in measure(model, x, torch.zeros_like(x))]  # every position counted
    assert got == pytest.approx(expected, rel=1e-5) and min(got) > 0


def test_the_logged_largest_logit_of_a_step_is_the_largest_over_its_micro_batches():
    model = tiny()
    recorder = AttentionLogitMax(model)
    a, b = torch.randint(0, 64, (2, T)), torch.randint(0, 64, (2, T))
    each = [[blk.max_abs_logit for blk in measure(model, xb, torch.zeros_like(xb))] for xb in (a, b)]
    recorder.active = True
    with torch.no_grad():
        model(a), model(b)
    recorder.active = False
    assert [v.item() for v in recorder.take()] == pytest.approx([max(p) for p in zip(*each)], rel=1e-5)


@pytest.mark.parametrize("placement", ["mhc", "attnres"])
def test_the_logged_largest_logit_has_one_column_per_attention_in_the_widened_designs(placement):
    """Hyper-connections widen the stream and attention over depth reads every earlier output: each block still
    has one attention, and each is recorded."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=T, n_layer=3, n_head=HEADS, n_embd=C, placement=placement))
    recorder = AttentionLogitMax(model)
    recorder.active = True
    x = torch.randint(0, 64, (2, T))
    with torch.no_grad():
        model(x)
    recorder.active = False
    got = [v.item() for v in recorder.take()]
    assert got == pytest.approx([b.max_abs_logit for b in measure(model.eval(), x, torch.zeros_like(x))], rel=1e-5)
    assert len(got) == 3
