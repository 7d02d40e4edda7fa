"""The numbers ``tests/doc_numbers.py`` finds in the docs but does not look up, each with its reason.

Three kinds: numbers that are not results (a setting, a constant, an estimate, arithmetic of the set-up, a
paper's claim, a licence's version); results whose files were not kept (`unfiled`); and results computed by hand
from files that are kept (`by hand`). Keep this list short: a result belongs in a results file, and an unfiled or
hand-computed one is a debt (measure it again into docs/results/, or have `compare` write it) that this list
keeps visible. An entry that names no number any more fails the test, so the list cannot go stale.
"""

from __future__ import annotations

from dataclasses import dataclass

SETTING, UNFILED, BY_HAND = "not a result", "unfiled", "by hand"


@dataclass(frozen=True)
class Unchecked:
    kind: str  # SETTING, UNFILED or BY_HAND
    doc: str  # "README.md", "docs/results.md"; "*": any doc
    around: str  # the number with the text around it, as its line prints it
    why: str


PRECISION_PROBE = "the evaluation-precision probe"  # results-history.md, "Evaluation precision"

UNCHECKED = [
    # settings, constants, estimates, arithmetic of the set-up, a paper's claim, a licence's version
    Unchecked(SETTING, "docs/comparing.md", "0.4 is 200 of the", "a warmup fraction: 200 / 500 steps"),
    Unchecked(SETTING, "docs/comparing.md", "0.1 nats of the unigram loss", "the not-learning threshold"),
    Unchecked(SETTING, "docs/comparing.md", "t(0.975, n - 1)", "the t quantile of a 95% interval"),
    Unchecked(SETTING, "docs/comparing.md", "five seeds 2.78 standard errors", "t(0.975, 4): a statistics table"),
    Unchecked(SETTING, "docs/comparing.md", "(0.05 nats)", "a suite's lr_tolerance"),
    Unchecked(SETTING, "*", "clipped at 1.0", "the gradient clip"),
    Unchecked(SETTING, "*", "clip at 1.0", "the gradient clip"),
    Unchecked(SETTING, "*", "clip 1.0", "the gradient clip"),
    Unchecked(SETTING, "docs/results.md", "clip 0.1", "B2T's own clip"),
    Unchecked(SETTING, "*", "std 0.02", "GPT-2's init (std 0.02; 0.02/sqrt(2N) for the output projections)"),
    Unchecked(SETTING, "docs/results.md", "std d^-1/2 = 0.088 against 0.02", "the two inits' embedding std"),
    Unchecked(SETTING, "docs/results-history.md", "AdamW (0.9, 0.95)", "AdamW's betas"),
    Unchecked(SETTING, "*", "within 0.1 nats", "compare's not-learning threshold"),
    Unchecked(SETTING, "docs/results.md", "alpha, init 0.5", "DyT's alpha init"),
    Unchecked(SETTING, "docs/results.md", "alpha init 0.8", "DyT's alpha init in the LLaMA setup"),
    Unchecked(SETTING, "docs/results.md", "0.2 before the MLP", "DyT's alpha init in the LLaMA setup"),
    Unchecked(SETTING, "docs/results.md", "alpha 0.8/0.2", "DyT's alpha init in the LLaMA setup"),
    Unchecked(SETTING, "docs/results.md", "readout alpha of 0.05", "a probe's setting"),
    Unchecked(SETTING, "docs/results.md", "0.08: almost no gradient", "tanh'(2) < 0.08: arithmetic"),
    Unchecked(SETTING, "docs/results.md", "56% faster to 1.2 BPB", "ReZero's paper's claim, cited"),
    Unchecked(SETTING, "docs/depth.md", "(0.45, 0.30 and 0.18 training tokens", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "0.45 to 0.18 tokens per parameter", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "| 2,379,520 | 0.30 |", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "| 9,517,312 | 0.10 |", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "| 19,034,368 | 0.05 |", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "| 1,189,888 | 0.45 |", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "| 4,758,784 | 0.18 |", "1,024,000 tokens / parameters"),
    Unchecked(SETTING, "docs/depth.md", "about 0.8 of a pass", "1,024,000 tokens / the train split's"),
    Unchecked(SETTING, "docs/depth.md", "about 2.6 seeded runs per", "a cost estimate"),
    Unchecked(SETTING, "docs/data.md", "Attribution 2.5 licence (CC-BY 2.5)", "the licence's version"),
    Unchecked(SETTING, "docs/training.md", "1.00-1.04 here", "a speed ratio `make bench` prints"),
    Unchecked(SETTING, "docs/designs.md", "the same, section 3.2", "a section number of the AttnRes paper"),
    Unchecked(SETTING, "docs/designs.md", "Magnitude, section 3.1", "a section number of the mHC paper"),
    Unchecked(SETTING, "docs/designs.md", "3000 for HC against 1.6 for mHC", "the mHC paper's claim, cited"),
    Unchecked(SETTING, "docs/designs.md", "stays near 1 (1.6)", "the mHC paper's claim, cited"),
    Unchecked(SETTING, "docs/designs.md", "alpha = 0.01, t_max", "mHC's gate init (its Table 5)"),
    Unchecked(SETTING, "docs/designs.md", "random N(0, 0.02)", "mHC's phi init, chosen here"),
    Unchecked(SETTING, "docs/designs.md", "logits of 0.9/0.1", "mHC's b_pre init, chosen here"),
    Unchecked(SETTING, "docs/designs.md", "starts at 0.9 on the", "mHC's b_res init, chosen here"),
    Unchecked(SETTING, "docs/designs.md", "(alpha 1.0 everywhere", "Derf's alpha init (its GPT-2 patch)"),
    Unchecked(SETTING, "docs/designs.md", "default alpha, 0.5, is", "Derf's module default"),
    Unchecked(SETTING, "docs/designs.md", "alpha 1.0 before attention", "DyT's alpha init at width <= 1024"),
    Unchecked(SETTING, "docs/designs.md", "0.8/0.2 at 4096, 0.6/0.15", "DyT's alpha inits in its LLaMA code"),
    Unchecked(SETTING, "docs/designs.md", "1.737 against 1.766", "the AttnRes paper's Table 4, cited"),
    Unchecked(SETTING, "docs/designs.md", "(alpha 0.5 with bias", "DyT's alpha init"),
    Unchecked(SETTING, "docs/designs.md", "untied head, alpha 1.0", "DyT's alpha init at width <= 1024"),
    Unchecked(SETTING, "docs/designs.md", "RMS of about 0.3 instead of 0.03", "the stream's RMS at init, arithmetic"),
    Unchecked(SETTING, "docs/designs.md", "shapes, 0.318 against 0.028", "the stream's RMS at init, a probe's"),
    # measured, quoted, and the files not kept
    Unchecked(UNFILED, "docs/training.md", "`val_bpb=2.3338`", "a fresh clone's run on the Xeon, commit 18aba0f"),
    Unchecked(UNFILED, "docs/training.md", "`val_bpb=2.3381`", "a fresh clone's run on the Xeon, commit 9d1143e"),
    Unchecked(UNFILED, "docs/training.md", "0.009 nats of val loss from the row above", "the two fresh clones' runs"),
    Unchecked(UNFILED, "docs/results-history.md", "| 6.3864 | +0.00020 | +0.00006 |", PRECISION_PROBE),
    Unchecked(UNFILED, "docs/results-history.md", "| 7.0044 | +0.00109 | +0.00107 |", PRECISION_PROBE),
    Unchecked(UNFILED, "docs/results-history.md", "| 5.5051 | +0.00005 | +0.00005 |", PRECISION_PROBE),
    Unchecked(UNFILED, "docs/results-history.md", "| 6.3501 | -0.00002 | -0.00000 |", PRECISION_PROBE),
    Unchecked(UNFILED, "docs/results-history.md", "about 0.001 nats, and under 0.0002", PRECISION_PROBE),
    Unchecked(UNFILED, "docs/results-history.md", "of 0.003 nats", "benchmarks/compare_hardware.py over runs not kept"),
    Unchecked(UNFILED, "docs/results-history.md", "at 6.424 and 6.288", "one seed's runs (the tables keep the means)"),
    Unchecked(UNFILED, "docs/results.md", "6.221 at 1.25e-4 and 6.860 at", "the lower-LR no-warmup CPU runs"),
    Unchecked(UNFILED, "docs/results.md", "gave 6.071 at 2.5e-4", "the lower-LR no-warmup CPU runs"),
    Unchecked(UNFILED, "docs/results.md", "(0.50 to 0.51-0.53)", "dyt_readout.py's measurement"),
    Unchecked(UNFILED, "docs/results.md", "alpha 0.22-0.23", "dyt_readout.py's measurement"),
    Unchecked(UNFILED, "docs/results.md", "5.061 (3 standard deviations", "a fresh clone's bf16-mixed run on an EPYC"),
    Unchecked(UNFILED, "docs/results.md", "2.3271 (val loss 5.0228)", "a fresh clone's run on the EPYC (390090e)"),
    Unchecked(UNFILED, "docs/depth.md", "1e-3: 5.379 against 5.375", "seed 1 of a 6-block run, and a lost run"),
    Unchecked(UNFILED, "docs/depth.md", "8e-3 gave 5.024 against 5.002", "seed 1 of a 6-block run, and a lost run"),
    Unchecked(UNFILED, "docs/depth.md", "1e-3 5.449 against 5.401", "seed 1 of a 6-block run, and a lost run"),
    Unchecked(UNFILED, "docs/depth.md", "(train loss 6.3-6.5)", "the depth runs' metrics.csv"),
    Unchecked(UNFILED, "docs/depth.md", "-0.011, -0.013 and -0.011", "the 8e-3 runner-up's layer contribution"),
    Unchecked(UNFILED, "docs/depth.md", "-0.06, -0.06 and -0.01 at 8e-3", "the 8e-3 runner-up's layer contribution"),
    # computed by hand from files that are kept
    Unchecked(BY_HAND, "docs/results-history.md", "at least 0.023 nats", "the smallest gap between ranks, H100 tables"),
    Unchecked(
        BY_HAND, "docs/results-history.md", "by at least 0.03 (the no-residual", "the smallest lead of a pick, H100"
    ),
    Unchecked(BY_HAND, "docs/results-history.md", "by 0.012). A shift", "no-residual's lead over its runner-up, H100"),
    Unchecked(BY_HAND, "docs/results.md", "(training loss 6.3-6.6 from step 50 on)", "the DyT runs' metrics.csv"),
    Unchecked(BY_HAND, "docs/results.md", "within 0.04 of the exact record", "metrics.csv against eval.json's clip"),
]
