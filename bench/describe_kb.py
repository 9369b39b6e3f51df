"""The describe bench's harness, shared by ``bench/describe.py`` and ``bench/describe_cv.py``: the report
file, and an embedder and a KB that memoize (the grid and the cross-validation ask the same questions
many times)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

for _k, _v in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
):
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

from remedy.cases.model import Signature  # noqa: E402
from remedy.kb.facade import KnowledgeBase  # noqa: E402
from remedy.retrieval.index import signature_text  # noqa: E402

__all__ = ["CachingEmbedder", "CachedKB", "load_reports"]


def load_reports(path: Path) -> list[dict]:
    """The reports, one dict per JSONL line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class CachingEmbedder:
    """The bundled embedder with a per-text memo: the grid re-reads the same clauses many times."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self._memo: dict[str, np.ndarray] = {}

    def encode(self, texts):
        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            for t, v in zip(missing, self.inner.encode(missing)):
                self._memo[t] = v
        return np.stack([self._memo[t] for t in texts]) if texts else self.inner.encode([])


class CachedKB:
    """A KB whose ``similar`` answers are memoized (same query, same filters, same hits)."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb
        self._memo: dict[tuple, list] = {}

    def similar(self, query, **kw):
        text = signature_text(query) if isinstance(query, Signature) else str(query)
        key = (text, tuple(sorted((k, str(v)) for k, v in kw.items())))
        if key not in self._memo:
            self._memo[key] = self.kb.similar(query, **kw)
        return self._memo[key]

    def __getattr__(self, name):
        # everything else (the store, for accepted rules) is the KB's own
        return getattr(self.kb, name)
