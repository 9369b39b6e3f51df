"""BM25 keyword search in memory, scoring as the index's Lance full-text index scores.

The service's resident search (:mod:`remedy.retrieval.resident`) needs the keyword half of a
hybrid query in well under a millisecond; Lance's own full-text query costs about 8 ms at 10k
cases, nearly all of it fixed cost. This module reproduces what Lance's default ``FTS()``
index does, checked against it (``tests/retrieval/test_keywords.py`` compares scores and orders;
``bench/service.py`` reports the agreement at 10k cases):

* Analysis (``FTS()``'s defaults): split on every character that is not alphanumeric, drop
  tokens of 40 bytes or more, lower-case, Snowball English stemming (PyStemmer, the algorithm
  Lance's stemmer runs), drop a stem found in the installed lancedb's stop-word list (stemming
  comes first: "very" stems to "veri" and is kept; 0.41 keeps "no", "not", "nor" and the
  fragments of contractions that 0.40 drops), ASCII folding.
* Scoring: Lucene's BM25 (k1 = 1.2, b = 0.75, idf = ln(1 + (N - n + 0.5) / (n + 0.5))), summed
  over the query's tokens (a repeated token counts again), any token matching (OR).

Written by hand rather than with a BM25 package because the analysis must be Lance's, not the
package's; the scoring is one sparse matrix product (scipy).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from importlib import metadata

import numpy as np
import Stemmer
from packaging.version import Version
from scipy import sparse

__all__ = ["analyze", "KeywordIndex", "K1", "B"]

K1 = 1.2
B = 0.75
#: tokens of this many bytes or more are dropped (``FTS(max_token_length=40)``)
MAX_TOKEN_BYTES = 40
_SPLIT = re.compile(r"[^\w]|_", re.UNICODE)  # \w is alphanumeric plus "_"; "_" splits too
#: The English stop words of Lance's tokenizer up to lancedb 0.40 (checked word by word against a
#: Lance index: "could", "ought", "would" and "cannot" are not in it).
STOP_WORDS_BEFORE_041 = frozenset(
    [
        "a",
        "about",
        "after",
        "again",
        "against",
        "ain",
        "all",
        "am",
        "an",
        "and",
        "are",
        "aren",
        "as",
        "at",
        "be",
        "been",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "couldn",
        "d",
        "did",
        "didn",
        "do",
        "doesn",
        "doing",
        "don",
        "down",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "hadn",
        "has",
        "hasn",
        "have",
        "haven",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "isn",
        "it",
        "its",
        "itself",
        "just",
        "ll",
        "m",
        "ma",
        "me",
        "mightn",
        "more",
        "most",
        "mustn",
        "my",
        "myself",
        "needn",
        "no",
        "nor",
        "not",
        "now",
        "o",
        "of",
        "off",
        "on",
        "or",
        "other",
        "our",
        "ours",
        "out",
        "over",
        "own",
        "re",
        "s",
        "same",
        "shan",
        "she",
        "should",
        "shouldn",
        "so",
        "some",
        "such",
        "t",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "ve",
        "was",
        "wasn",
        "we",
        "were",
        "weren",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "will",
        "with",
        "won",
        "wouldn",
        "y",
        "you",
        "your",
        "yours",
        "yourself",
    ]
)
#: Words lancedb 0.41 no longer drops (checked word by word against a 0.41 index, see
#: ``tests/retrieval/test_keywords.py``): the negations and the fragments of contractions.
SEARCHABLE_SINCE_041 = frozenset(
    [
        "ain",
        "aren",
        "couldn",
        "d",
        "didn",
        "doesn",
        "don",
        "hadn",
        "hasn",
        "haven",
        "isn",
        "ll",
        "m",
        "ma",
        "mightn",
        "mustn",
        "needn",
        "no",
        "nor",
        "not",
        "o",
        "s",
        "shan",
        "shouldn",
        "t",
        "ve",
        "wasn",
        "weren",
        "won",
        "wouldn",
        "y",
    ]
)


def _lance_at_least_041() -> bool:
    try:
        return Version(metadata.version("lancedb")) >= Version("0.41")
    except metadata.PackageNotFoundError:  # pragma: no cover - lancedb is a dependency
        return True


#: The stop words of the installed lancedb's full-text index.
STOP_WORDS = STOP_WORDS_BEFORE_041 - SEARCHABLE_SINCE_041 if _lance_at_least_041() else STOP_WORDS_BEFORE_041
_STEMMER = Stemmer.Stemmer("english")


def analyze(text: str) -> list[str]:
    """The index terms of ``text``, in order, as Lance's default full-text analyzer makes them."""
    words = [w.lower() for w in _SPLIT.split(text) if w and len(w.encode("utf-8")) < MAX_TOKEN_BYTES]
    return [_fold(s) for s in _stems(tuple(words)) if s not in STOP_WORDS]


@lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    return _STEMMER.stemWord(word)


def _stems(words: tuple[str, ...]) -> list[str]:
    return [_stem(w) for w in words]


def _fold(term: str) -> str:
    """ASCII folding: accents dropped ("café" -> "cafe")."""
    if term.isascii():
        return term
    return "".join(c for c in unicodedata.normalize("NFKD", term) if not unicodedata.combining(c))


class KeywordIndex:
    """BM25 over a fixed list of documents (rows); built once, searched many times."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.vocab: dict[str, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        counts: list[int] = []
        lengths = np.zeros(len(texts), dtype=np.float64)
        for r, text in enumerate(texts):
            terms = analyze(text or "")
            lengths[r] = len(terms)
            tf: dict[int, int] = {}
            for t in terms:
                j = self.vocab.setdefault(t, len(self.vocab))
                tf[j] = tf.get(j, 0) + 1
            rows.extend([r] * len(tf))
            cols.extend(tf)
            counts.extend(tf.values())
        n = len(texts)
        shape = (n, max(len(self.vocab), 1))
        tf_m = sparse.csc_matrix((np.asarray(counts, dtype=np.float64), (rows, cols)), shape=shape)
        avgdl = float(lengths.mean()) if n and lengths.sum() > 0 else 1.0
        df = np.diff(tf_m.indptr).astype(np.float64)  # documents per term (csc: one column a term)
        self.idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        # Per (document, term) weight: idf * tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)).
        norm = K1 * (1.0 - B + B * lengths / avgdl)
        w = tf_m.tocoo()
        data = self.idf[w.col] * w.data * (K1 + 1.0) / (w.data + norm[w.row])
        self._weights = sparse.csc_matrix((data, (w.row, w.col)), shape=shape)

    def scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every row for ``query`` (None when no query term is in any document)."""
        cols = [self.vocab[t] for t in analyze(query) if t in self.vocab]
        if not cols:
            return None
        counts: dict[int, int] = {}
        for c in cols:
            counts[c] = counts.get(c, 0) + 1
        q = np.zeros(self._weights.shape[1])
        q[list(counts)] = list(counts.values())
        return np.asarray(self._weights @ q).ravel()

    def top(self, query: str, k: int, keep: np.ndarray | None = None) -> list[int]:
        """Rows of the ``k`` best-scoring documents that match at least one term, best first."""
        s = self.scores(query)
        if s is None or k <= 0:
            return []
        rows = np.flatnonzero(s > 0) if keep is None else np.flatnonzero((s > 0) & keep)
        if rows.size > k:
            part = rows[np.argpartition(-s[rows], k - 1)[:k]]
        else:
            part = rows
        return [int(r) for r in part[np.argsort(-s[part], kind="stable")]]
