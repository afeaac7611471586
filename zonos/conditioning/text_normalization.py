"""Text normalisation applied before phonemisation (the rules Zonos v0.1 was trained with).

Japanese (any language code containing ``"ja"``) is converted to a space-separated katakana reading with
kanjize + SudachiPy (full dictionary, split mode A). Every other language, whatever it is, gets the same
*English* number expansion: thousands commas, pounds, dollars, decimals, ordinals and integers are spelled
out with ``inflect``. The English rules are applied to every language on purpose: that is what the model saw.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import unicodedata
from functools import lru_cache
from typing import Any

from zonos.errors import ZonosInputError

__all__ = [
    "MissingDependencyError",
    "normalize_numbers",
    "normalize_japanese",
    "normalize_text",
]


class MissingDependencyError(ZonosInputError, ImportError):
    """An optional dependency needed for this input is not installed (e.g. Japanese text without the ``ja``
    extra). A :class:`~zonos.errors.ZonosInputError`, so front ends show its message; also an ImportError."""


_JA_INSTALL_HINT = "install the Japanese extras with: pip install 'zonos-accel[ja]'"

# --- English number expansion -------------------------------------------------------------------------------
# The steps run in this order; later steps see the output of earlier ones (e.g. "$2.50" becomes "2 dollars,
# 50 cents" and the integers are spelled out by the last step).
# Only well-formed groups ("1,000,000"): a list such as "1,2,3" keeps its commas and is read number by number.
_THOUSANDS_RE = re.compile(r"(?<![0-9,])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9]|,[0-9])")
_POUNDS_RE = re.compile(r"£([0-9,]*[0-9]+)")
_DOLLARS_RE = re.compile(r"\$([0-9.,]*[0-9]+)")
_DECIMAL_RE = re.compile(r"[0-9]+\.[0-9]+")
_ORDINAL_RE = re.compile(r"[0-9]+(?:st|nd|rd|th)")
_INTEGER_RE = re.compile(r"[0-9]+")
# inflect spells integers below 10**36 only; longer digit strings (an ID, a pasted hash) are read digit by digit,
# as a person reads them. This also keeps Python's int() away from strings past its 4300-digit limit.
MAX_SPELLED_DIGITS = 36
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _digit_by_digit(digits: str) -> str:
    return " ".join(_DIGIT_WORDS[int(d)] for d in digits)


def _too_long(digits: str) -> bool:
    return len(digits.lstrip("0")) > MAX_SPELLED_DIGITS


@lru_cache(maxsize=1)
def _inflect_engine() -> Any:
    import inflect  # imported lazily: it takes a noticeable fraction of a second

    return inflect.engine()


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _dollars(m: re.Match) -> str:
    amount = m.group(1)
    parts = amount.split(".")
    if len(parts) > 2:  # "1.2.3": not an amount we can read; keep the digits
        return f"{amount} dollars"
    # Commas were removed earlier for well-formed numbers; strip stray ones so int() cannot fail.
    whole_digits = parts[0].replace(",", "") or "0"
    cents_digits = (parts[1].replace(",", "") or "0") if len(parts) == 2 else "0"
    if _too_long(whole_digits) or _too_long(cents_digits):
        return f"{whole_digits} dollars" + (f" {cents_digits} cents" if len(parts) == 2 else "")
    whole, cents = int(whole_digits), int(cents_digits)
    # The digits after the point are read as an integer ("$1.5" -> 5 cents), as in training.
    if whole and cents:
        return f"{_plural(whole, 'dollar')}, {_plural(cents, 'cent')}"
    if whole:
        return _plural(whole, "dollar")
    if cents:
        return _plural(cents, "cent")
    return "zero dollars"


def _ordinal(m: re.Match) -> str:
    text = m.group(0)
    if _too_long(text[:-2]):
        return f"{_digit_by_digit(text[:-2])} {text[-2:]}"
    return _inflect_engine().number_to_words(text)


def _integer(m: re.Match) -> str:
    digits = m.group(0)
    if _too_long(digits):
        return _digit_by_digit(digits)
    words = _inflect_engine().number_to_words
    n = int(digits)
    if 1000 < n < 3000:  # read like a year
        if n == 2000:
            return "two thousand"
        if 2000 < n < 2010:
            return "two thousand " + words(n % 100)
        if n % 100 == 0:
            return words(n // 100) + " hundred"
        # Two-digit groups ("nineteen eighty-four", "nineteen oh five"), without inflect's group commas.
        return words(n, andword="", zero="oh", group=2).replace(", ", " ")
    return words(n, andword="")


def normalize_numbers(text: str) -> str:
    """Spell out numbers, currency, decimals and ordinals in English words. Never raises: digit strings longer
    than :data:`MAX_SPELLED_DIGITS` are read digit by digit.

    >>> normalize_numbers("$2.50 in 1984")
    'two dollars, fifty cents in nineteen eighty-four'
    """
    text = _THOUSANDS_RE.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _POUNDS_RE.sub(r"\1 pounds", text)
    text = _DOLLARS_RE.sub(_dollars, text)
    text = _DECIMAL_RE.sub(lambda m: m.group(0).replace(".", " point "), text)
    text = _ORDINAL_RE.sub(_ordinal, text)
    text = _INTEGER_RE.sub(_integer, text)
    return text


# --- Japanese -------------------------------------------------------------------------------------------------


def _import_optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(
            f"Japanese text needs the optional package {module!r}, which is not installed; {_JA_INSTALL_HINT}"
        ) from e


@lru_cache(maxsize=1)
def _sudachi_tokenizer() -> Any:
    sudachipy = _import_optional("sudachipy")
    # Check for the dictionary package ourselves: SudachiPy's own error for a missing dictionary is obscure.
    if importlib.util.find_spec("sudachidict_full") is None:
        raise MissingDependencyError(
            f"Japanese text needs the SudachiPy full dictionary 'sudachidict_full', which is not installed; "
            f"{_JA_INSTALL_HINT}"
        )
    return sudachipy.Dictionary(dict="full").create()


def normalize_japanese(text: str) -> str:
    """NFKC, digits -> kanji numerals, then the SudachiPy (full dictionary, mode A) katakana readings joined by
    spaces. Needs ``pip install 'zonos-accel[ja]'``; raises :class:`MissingDependencyError` otherwise."""
    kanjize = _import_optional("kanjize")
    tokenizer = _sudachi_tokenizer()
    split_mode_a = _import_optional("sudachipy").SplitMode.A
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"\d+", lambda m: _kanji_number(kanjize, m.group(0)), text)
    return " ".join(token.reading_form() for token in tokenizer.tokenize(text, split_mode_a))


def _kanji_number(kanjize: Any, digits: str) -> str:
    if _too_long(digits):  # past the named units: one numeral per digit
        return "".join(kanjize.number2kanji(int(d)) if d != "0" else "〇" for d in digits)
    return kanjize.number2kanji(int(digits))


def normalize_text(text: str, language: str) -> str:
    """Normalise one text for ``language`` (Japanese path if the code contains "ja", English numbers otherwise)."""
    if "ja" in language.lower():
        return normalize_japanese(text)
    return normalize_numbers(text)
