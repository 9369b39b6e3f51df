"""What a description is read in: clauses that keep lists and brackets whole, whole sentences for contrasts,
and phrasings that tell a symptom from its look-alikes (hand-written sentences, not the bench reports)."""

from __future__ import annotations

import pytest

from remedy.retrieval.describe import SymptomReader, reading_units, split_clauses


@pytest.fixture(scope="module")
def reader(embedder) -> SymptomReader:
    """The reader with the shipped settings."""
    return SymptomReader(embedder)


def _tags(reader: SymptomReader, text: str) -> list[str]:
    return [r.tag for r in reader.read(text)]


def test_commas_in_brackets_and_list_items_do_not_cut_claims():
    assert split_clauses("SAC (16 components, 4 steps per iteration) on the ant task diverges.") == [
        "SAC (16 components, 4 steps per iteration) on the ant task diverges"
    ]
    # "gamma" and "batch size" are items of a list, not claims of their own
    assert split_clauses("I tried a new network, gamma, batch size, nothing changed.") == [
        "I tried a new network, gamma, batch size",
        "nothing changed",
    ]
    # a short clause that opens a sentence is still a claim
    assert split_clauses("It falls, but very slowly.") == ["It falls", "very slowly"]


def test_a_contrast_is_also_read_as_a_whole_sentence():
    text = "It scores a very high reward, but it drives in circles. It walks in one simulator, but not in another."
    units = reading_units(text)
    assert units[: len(split_clauses(text))] == split_clauses(text)  # the clauses first, unchanged
    assert "It scores a very high reward, but it drives in circles" in units
    # a sentence whose halves disagree in negation is never read whole
    assert "It walks in one simulator, but not in another" not in units


def test_high_reward_but_odd_behaviour_reads_as_reward_hacking(reader):
    text = "The agent reaches a very high reward, but when I watch it, it just drives back and forth."
    assert "reward_hacking_suspected" in _tags(reader, text)


def test_a_safety_cost_that_stays_high_reads_as_constraint_violations(reader):
    assert _tags(reader, "The safety cost never goes down during training.")[:1] == ["constraint_violations"]


@pytest.mark.parametrize(
    "text, wrong",
    [
        # a flat learning curve is not a sparse per-step reward
        ("The mean episode reward stays at about 12 for the whole run.", "sparse_signal"),
        # training steps are not episode steps
        ("Even after 800,000 training steps there is no progress.", "short_time_limit"),
    ],
)
def test_look_alikes_do_not_fire(reader, text, wrong):
    assert wrong not in _tags(reader, text)
