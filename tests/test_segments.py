"""Long-text segmentation: every segment within the budget, cut at the most natural boundary, no word cut,
no character lost, on hand-made cases and on seeded random texts."""

from __future__ import annotations

import random
import re

import pytest

from zonos.conditioning.segments import CJK_WEIGHT, DEFAULT_MAX_CHARS, split_text, text_cost
from zonos.errors import ZonosInputError

CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def latin_alnum(c: str) -> bool:
    return c.isalnum() and not CJK.match(c)


def check_invariants(text: str, segments: list[str], budget: int) -> None:
    """Segments are stripped slices of ``text`` in order covering every non-space character; each is within
    the budget unless it is one word; every cut falls on a space or next to a CJK character."""
    assert segments and all(s and s == s.strip() for s in segments)
    assert squeeze("".join(segments)) == squeeze(text)
    position = 0
    for segment in segments:
        start = text.index(segment, position)
        assert text[position:start].strip() == ""
        end = start + len(segment)
        if text_cost(segment) > budget:  # only one word (or one CJK character) may exceed it
            cjk = len(CJK.findall(segment))
            assert len(segment.split()) == 1 and (cjk == 0 or cjk == 1 and not any(map(latin_alnum, segment))), segment
        if end < len(text):  # no cut between two letters or digits of a (non-CJK) word
            assert not (latin_alnum(segment[-1]) and latin_alnum(text[end])), (segment, text[end:])
        position = end


def test_short_text_is_one_segment_and_whitespace_is_trimmed():
    assert split_text("  Hello there.  ") == ["Hello there."]
    text = "word " * (DEFAULT_MAX_CHARS // 5)
    assert split_text(text) == [text.strip()]


def test_sentences_are_packed_whole_and_never_cut_when_they_fit():
    text = "One two three. Four five six! Seven eight nine? Ten eleven twelve… Thirteen."
    assert split_text(text, 30) == [
        "One two three. Four five six!",
        "Seven eight nine?",
        "Ten eleven twelve… Thirteen.",
    ]
    assert split_text(text, 14) == [
        "One two three.",
        "Four five six!",
        "Seven eight",
        "nine?",
        "Ten eleven",
        "twelve…",
        "Thirteen.",
    ]


def test_a_long_sentence_is_cut_at_clauses_then_words_and_starts_its_own_segment():
    text = "Short one. This sentence runs on, and on, and then on a little more; it never stops."
    segments = split_text(text, 40)
    check_invariants(text, segments, 40)
    # The short sentence is not glued to the head of the long one: the long one starts a segment.
    assert segments[0] == "Short one."
    assert segments[1:] == ["This sentence runs on, and on,", "and then on a little more;", "it never stops."]
    assert split_text("Alpha, beta, gamma delta epsilon zeta.", 12) == [
        "Alpha, beta,",
        "gamma delta",
        "epsilon",
        "zeta.",
    ]


def test_abbreviations_initials_decimals_and_quotes_do_not_end_sentences():
    text = 'Dr. Smith met J. R. R. Tolkien in the U.S. on day 3.5, e.g. at noon. "Really?" she said. Yes.'
    sentences = split_text(text, 1)  # a budget of one: every word on its own, so sentences show as cut points
    assert "3.5," in sentences and "Dr." in sentences  # the words themselves stay whole
    assert split_text(text, 75) == [
        "Dr. Smith met J. R. R. Tolkien in the U.S. on day 3.5, e.g. at noon.",
        '"Really?" she said. Yes.',
    ]


def test_blank_lines_and_newlines_end_sentences():
    assert split_text("Title line\nBody of the text here\n\nNext paragraph", 25) == [
        "Title line",
        "Body of the text here",
        "Next paragraph",
    ]


def test_cjk_punctuation_and_weight():
    assert text_cost("今日は") == 3 * CJK_WEIGHT and text_cost("abc") == 3
    text = "今日は良い天気です。明日も晴れるでしょう！散歩に行きましょう、公園まで。"
    assert split_text(text, 40) == [
        "今日は良い天気です。",
        "明日も晴れるでしょう！",
        "散歩に行きましょう、",
        "公園まで。",
    ]
    assert split_text(text, 70) == ["今日は良い天気です。明日も晴れるでしょう！", "散歩に行きましょう、公園まで。"]
    segments = split_text("我们今天去公园玩吧我们今天去公园玩吧", 9)  # no punctuation: cut between characters
    assert segments == ["我们今", "天去公", "园玩吧"] * 2


def test_a_word_longer_than_the_budget_is_kept_whole():
    assert split_text("a supercalifragilistic word", 8) == ["a", "supercalifragilistic", "word"]


@pytest.mark.parametrize("text,budget", [("", 10), ("   \n ", 10), ("ok", 0), ("ok", -3), ("ok", 2.5), ("ok", True)])
def test_bad_input_is_a_zonos_input_error(text, budget):
    with pytest.raises(ZonosInputError):
        split_text(text, budget)
    with pytest.raises(ValueError):  # ZonosInputError is a ValueError
        split_text(text, budget)


def test_not_a_string_is_refused():
    with pytest.raises(ZonosInputError, match="text must be a string"):
        split_text(b"bytes", 10)  # type: ignore[arg-type]


def random_text(rng: random.Random) -> str:
    words = ["a", "cat", "sat", "on", "the", "mat", "Dr.", "3.5", "extraordinarily", "U.S.", "well—", "(yes)"]
    cjk = ["今日", "は", "天気", "です", "公園"]
    ends = [".", "!", "?", ",", ";", ":", "", "", "", "。", "、", "\n", "…"]
    out = []
    for _ in range(rng.randint(1, 120)):
        word = rng.choice(cjk) if rng.random() < 0.2 else rng.choice(words)
        out.append(word + rng.choice(ends) + rng.choice([" ", " ", "  ", "\n", ""]))
    return "".join(out)


@pytest.mark.parametrize("seed", range(40))
def test_random_texts_keep_every_invariant(seed):
    rng = random.Random(seed)
    text = random_text(rng)
    if not text.strip():
        text = "fallback."
    for budget in (1, 7, 23, 80, 300):
        segments = split_text(text, budget)
        check_invariants(text, segments, budget)
        if text_cost(text.strip()) <= budget:
            assert segments == [text.strip()]
