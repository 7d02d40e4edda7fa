"""lm-evaluation-harness's Hugging Face model on a resnorm-lm export: its rolling log-likelihood of a text against
this package's own forward on the same tokens. Needs lm_eval (pip install lm_eval; not a dependency):

    python scripts/lm_eval_check.py exports/prenorm-12l
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from tokenizers import Tokenizer

from resnorm_lm.data.tokenizer import EOT
from resnorm_lm.model import exported

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
)


def main(folder: str) -> None:
    lm = HFLM(pretrained=folder, device="cpu", batch_size=1)
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(TEXT,), idx=0)
    theirs = lm.loglikelihood_rolling([request])[0]
    model, _ = exported.load_model(Path(folder))
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    ids = tokenizer.encode(TEXT).ids  # (T,)
    inputs = torch.tensor([[tokenizer.token_to_id(EOT), *ids[:-1]]])  # (1, T): end-of-text starts the context
    with torch.no_grad():
        logits, _ = model.eval()(inputs)  # (1, T, V)
    ours = -F.cross_entropy(logits[0], torch.tensor(ids), reduction="sum").item()
    print(
        f"{folder}: {len(ids)} tokens; log-likelihood: lm-eval {theirs:.4f}, resnorm-lm {ours:.4f} "
        f"(difference {theirs - ours:.2e} nats)"
    )


if __name__ == "__main__":
    main(sys.argv[1])
