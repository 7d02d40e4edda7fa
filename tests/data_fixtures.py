"""A small English stand-in corpus for the fast data tests (no network, no downloads)."""

from __future__ import annotations

import random
from pathlib import Path

SENTENCES = [
    "The river ran slowly past the mill, and the miller watched it from his door.",
    "In the morning the market filled with carts of apples, bread and cheese.",
    "She wrote a letter to her brother, who had gone to sea the summer before.",
    "Nobody in the village could remember a winter as cold as that one.",
    "The old clock in the hall struck nine, and the children ran upstairs to bed.",
    "A storm came in from the west, bending the trees and flattening the wheat.",
    "He counted the coins twice, then put them back in the leather purse.",
    "The teacher asked a question that none of the pupils could answer.",
    "When the lamps were lit, the street looked warmer than it was.",
    "They walked along the cliffs until the lighthouse came into view.",
    "Her garden was full of roses, beans, and a crooked pear tree.",
    "The train was late again, so the station master apologised to everyone.",
    "After supper the family sat by the fire and told stories of the war.",
    "A small dog followed the baker all the way home through the rain.",
    "The ship's captain studied the map, frowning at the narrow channel.",
    "On Sundays the bells rang across the valley from three different churches.",
]


def make_documents(n_docs: int, seed: int = 0, paragraphs: int = 3) -> list[str]:
    """``n_docs`` documents of a few paragraphs each, deterministic in ``seed``."""
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        paras = [" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(3, 6))) for _ in range(paragraphs)]
        docs.append(f"Chapter {i + 1}\n\n" + "\n\n".join(paras) + "\n")
    return docs


def write_documents(folder: Path, docs: list[str], prefix: str = "doc") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        path = folder / f"{prefix}{i:03d}.txt"
        path.write_text(doc, encoding="utf-8")
        paths.append(path)
    return paths
