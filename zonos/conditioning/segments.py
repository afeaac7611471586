"""Split long text into segments that each fit one generation, at the most natural boundary available.

One generation speaks at most ``max_new_tokens`` frames (2580, 30 s, by default), so long text is spoken
segment by segment. :func:`split_text` cuts at sentence ends first (``. ! ? …`` followed by a space,
``。！？`` anywhere, blank lines), packs whole sentences into segments up to a budget, cuts a sentence that is
over the budget at its clauses (``, ; : —`` and ``，、；：``), and a clause that is still over it between words.
A word is never cut: one longer than the budget becomes a segment of its own.

The budget is counted in :func:`text_cost` units: one per character, and :data:`CJK_WEIGHT` per Chinese,
Japanese or Korean character, since one of those takes about as long to say as three Latin letters.
"""

from __future__ import annotations

import re

from zonos.errors import ZonosInputError

__all__ = ["CJK_WEIGHT", "DEFAULT_MAX_CHARS", "split_text", "text_cost"]

# Read English runs at about 14 characters a second (an estimate: ~150 words a minute, ~5.5 characters a word
# with the space), so 300 characters are ~21 s of speech: under the 30 s a generation allows by default, with
# room for slow speaking rates and pauses.
DEFAULT_MAX_CHARS = 300
# Mandarin runs at about 4-5 characters a second and Japanese at 7-8 kana: one character ≈ 3 Latin letters.
CJK_WEIGHT = 3

# Hiragana, katakana, CJK ideographs (and extension A), Hangul syllables, compatibility ideographs.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK}]")
_CLOSERS = "\"'”’»)\\]」』）】"
# A Western sentence end needs a space (or the end) after it, so "3.14" and "e.g.x" stay whole; a CJK one does not.
_SENTENCE_END = re.compile(rf"[.!?…]+[{_CLOSERS}]*(?=\s|$)|[。！？｡]+[{_CLOSERS}]*|\n\s*")
_CLAUSE_END = re.compile(rf"(?:[,;:]|—|–|--)[{_CLOSERS}]*(?=\s|$)|[，、；：]+[{_CLOSERS}]*|\s(?:—|–|--)(?=\s)")
# A word: one CJK character with the punctuation after it, or a run of anything else up to a space or CJK.
_WORD = re.compile(rf"[{_CJK}][^\w\s]*|[^\s{_CJK}]+")
# Words whose trailing period does not end a sentence (compared lower-case, without the period); dotted
# initialisms ("e.g", "U.S") and single capitals ("J. R. R. Tolkien") are recognised by their shape.
_ABBREVIATIONS = frozenset("mr mrs ms dr prof sr jr st vs etc cf no vol fig approx dept est inc ltd co mt ft".split())
_INITIALS = re.compile(r"(?:\w\.)+\w|[A-Z]")


def text_cost(text: str) -> int:
    """The budget units ``text`` uses: 1 per character, :data:`CJK_WEIGHT` per CJK character."""
    return len(text) + (CJK_WEIGHT - 1) * len(_CJK_RE.findall(text))


def split_text(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Split ``text`` into segments of at most ``max_chars`` :func:`text_cost` units, in order.

    Each segment is a stripped slice of ``text`` (its inner spacing kept), so the segments hold every
    non-space character of ``text`` once, in order. A text within the budget comes back as one segment.
    Raises :class:`ZonosInputError` for empty text or a budget that is not a positive int.
    """
    if not isinstance(text, str):
        raise ZonosInputError(f"text must be a string, got {type(text).__name__}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ZonosInputError(f"max_chars must be a positive int (characters per segment), got {max_chars!r}")
    whole = _strip(text, 0, len(text))
    if whole is None:
        raise ZonosInputError("text is empty (or only whitespace); pass the sentences to speak")
    return [text[start:end] for start, end in _split(text, whole, 0, max_chars)]


def _split(text: str, span: tuple[int, int], level: int, max_chars: int) -> list[tuple[int, int]]:
    """Spans of ``text[span]`` within the budget: cut at boundaries of ``level`` (0 sentences, 1 clauses,
    2 words), pieces packed greedily, a piece over the budget split at the next level. Such a piece starts a
    new span, so a span never ends inside a sentence (or clause) that could have started the next one."""
    if level == 0:
        cuts = _sentence_ends(text, *span)
    elif level == 1:
        cuts = (m.end() for m in _CLAUSE_END.finditer(text, *span))
    else:
        return _pack(text, [m.span() for m in _WORD.finditer(text, *span)], max_chars)
    out: list[tuple[int, int]] = []
    for piece in _pieces(text, *span, cuts):
        if _cost(text, piece) > max_chars:
            out.extend(_split(text, piece, level + 1, max_chars))
        elif out and _cost(text, (out[-1][0], piece[1])) <= max_chars:
            out[-1] = (out[-1][0], piece[1])
        else:
            out.append(piece)
    return out


def _cost(text: str, span: tuple[int, int]) -> int:
    return text_cost(text[span[0] : span[1]])


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    """``(start, end)`` narrowed to exclude surrounding whitespace; None when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _sentence_ends(text: str, start: int, end: int):
    """Positions just after each sentence end in ``text[start:end]`` (abbreviations and initials skipped)."""
    for m in _SENTENCE_END.finditer(text, start, end):
        if text[m.start()] == "." and m.group().rstrip(_CLOSERS) == ".":
            word = text[start : m.start()].rsplit(None, 1)[-1] if text[start : m.start()].strip() else ""
            word = word.lstrip(_CLOSERS + "(\"'“‘«")
            if word.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(word):
                continue
        yield m.end()


def _pieces(text: str, start: int, end: int, cuts) -> list[tuple[int, int]]:
    """``text[start:end]`` cut after each position in ``cuts``, each piece stripped, empty ones dropped."""
    spans, prev = [], start
    for cut in [*cuts, end]:
        span = _strip(text, prev, min(cut, end))
        if span:
            spans.append(span)
        prev = max(prev, cut)
    return spans


def _pack(text: str, pieces: list[tuple[int, int]], max_chars: int) -> list[tuple[int, int]]:
    """Join consecutive pieces greedily into spans of at most ``max_chars`` units (the text between them kept)."""
    out: list[tuple[int, int]] = []
    for start, end in pieces:
        if out and _cost(text, (out[-1][0], end)) <= max_chars:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out
