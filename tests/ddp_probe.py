"""A callback the DDP test passes on the command line: each rank records what it trained on."""

import hashlib
import json
import os
from pathlib import Path

import lightning as L


class RecordRankBatches(L.Callback):
    """Writes ``rank<r>.json`` into $RESNORM_LM_PROBE_DIR: the batches seen and a hash of the final weights."""

    def __init__(self) -> None:
        self.windows: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        x, _ = batch  # (B, T)
        self.windows += [row[:8].tolist() for row in x]

    def on_train_end(self, trainer, pl_module):
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().float().numpy().tobytes())
        out = Path(os.environ["RESNORM_LM_PROBE_DIR"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"windows": self.windows, "weights": digest.hexdigest()}))
