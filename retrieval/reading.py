"""Reading units of a description: sentences, clauses, polarity and brackets.

A description is read claim by claim. A claim keeps its own negation ("it never reaches the goal"
and "it jitters" are two claims of opposite polarity), a comma inside brackets lists details rather
than ending a claim, and a very short comma-separated piece is an item of a list. These units are
what :class:`remedy.retrieval.describe.SymptomReader` compares with the tag phrasings.
"""

from __future__ import annotations

import re

__all__ = ["is_negated", "split_clauses", "reading_units"]

_NEGATION = re.compile(r"\b(?:not|no|never|none|nothing|nor|neither|without|cannot)\b|n't\b", re.IGNORECASE)
# a point or comma between digits is a number ("0.02", "12,000"), not the end of a sentence or clause
_SENTENCES = re.compile(r"(?:(?<!\d)\.|\.(?!\d)|[!?;:\n])+")
# contrast words start a new clause: "it reaches the goal but does not jitter" reads as two claims
_CLAUSES = re.compile(r"((?<!\d),|,(?!\d)|\b(?:but|however|although|though|whereas|while|yet|except)\b)", re.IGNORECASE)
# a comma inside brackets lists details ("(PPO, SAC)", "(Humanoid, seed 0)"), it does not end a claim
_BRACKETED = re.compile(r"\([^()]*\)")
#: a comma-separated piece this short is an item of a list ("the architecture, learning rate, batch
#: size"), not a claim of its own: it stays with the piece before it.
_LIST_ITEM_WORDS = 2


_AND = re.compile(r"\band\b", re.IGNORECASE)


def is_negated(text: str) -> bool:
    """Whether ``text`` carries a negation cue (not, no, never, without, n't, ...)."""
    return bool(_NEGATION.search(text))


def split_clauses(text: str) -> list[str]:
    """The description cut into sentences, and sentences into clauses at commas and contrast words.

    Each clause keeps its own negation: an "and" that joins a negated claim to a plain one also
    splits ("it never finds the exit and keeps circling" is two claims of opposite polarity).
    Clauses of fewer than two words are dropped.
    """
    out: list[str] = []
    for sentence in _SENTENCES.split(text or ""):
        for part in _sentence_clauses(sentence):
            if part not in out:
                out.append(part)
    return out


def reading_units(text: str) -> list[str]:
    """The clauses of ``text`` (:func:`split_clauses`), plus each sentence cut into several clauses of one polarity.

    A contrast often carries the meaning that neither half has alone: "it reaches a high reward,
    but it drives in circles" (reward hacking), "it walks in one simulator, but falls in another"
    (a generalization gap). A whole sentence is read too when all its clauses agree in negation, so
    a negated half never lends its polarity to a plain one.
    """
    out = split_clauses(text)
    for sentence in _SENTENCES.split(text or ""):
        parts = _sentence_clauses(sentence)
        whole = " ".join(sentence.split())
        if len(parts) > 1 and len({is_negated(p) for p in parts}) == 1 and whole not in out:
            out.append(whole)
    return out


def _sentence_clauses(sentence: str) -> list[str]:
    """One sentence cut into clauses (see :func:`split_clauses`); list items stay with the clause before them."""
    hidden = _BRACKETED.sub(lambda m: m.group(0).replace(",", "\x00"), sentence)
    pieces = _CLAUSES.split(hidden)
    merged: list[str] = []
    for i in range(0, len(pieces), 2):
        piece = " ".join(pieces[i].replace("\x00", ",").split())
        after_comma = i > 0 and pieces[i - 1] == ","
        list_item = 0 < len(piece.split()) <= _LIST_ITEM_WORDS and not is_negated(piece)
        if after_comma and merged and list_item:
            merged[-1] = f"{merged[-1]}, {piece}"
        elif piece:
            merged.append(piece)
    return [part for clause in merged for part in _split_polarity(clause) if len(part.split()) >= 2]


def _split_polarity(clause: str) -> list[str]:
    """``clause`` cut at each "and" whose two sides differ in negation; otherwise kept whole."""
    parts = [p.strip() for p in _AND.split(clause)]
    if len(parts) < 2 or len({is_negated(p) for p in parts}) < 2:
        return [clause]
    out = [parts[0]]
    for part in parts[1:]:
        if is_negated(part) == is_negated(out[-1]):
            out[-1] = f"{out[-1]} and {part}"
        else:
            out.append(part)
    return out
