"""Text -> eSpeak-NG phonemes -> ids of the 189-entry Zonos phoneme vocabulary.

Pipeline (one text at a time): :func:`~zonos.conditioning.text_normalization.normalize_text`, then eSpeak-NG
through ``phonemizer`` (voice = the language code, punctuation kept, stress marks on), then one id per Unicode
code point, wrapped as ``[BOS] + ids + [EOS]``. A batch is left-padded with PAD.

Phoneme output depends on the installed eSpeak-NG version (the tests' golden file records the version it was
made with); the model was trained with whatever version upstream had, which is not pinned.
"""

from __future__ import annotations

import functools
import logging
import os
import string
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ZonosInputError
from .text_normalization import MissingDependencyError, normalize_text

__all__ = [
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    "PUNCTUATION",
    "SYMBOLS",
    "VOCAB_SIZE",
    "SYMBOL_TO_ID",
    "EspeakNotFoundError",
    "encode_phonemes",
    "tokenize_phonemes",
    "get_espeak_backend",
    "check_phonemes",
    "check_text",
    "has_phonemes",
    "MAX_TEXT_CHARS",
    "phonemize",
    "phonemize_text",
]

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# One generation's text: the published models hold 4096 positions for prefix and frames, and text yields about a
# phoneme per character, so longer text cannot fit one; refusing it first also bounds eSpeak's cost, which grows
# faster than the length (50k characters: 2 s, 200k: 30 s).
MAX_TEXT_CHARS = 4096
_NUM_SPECIAL = 4
_FIRST_SOUND_ID = 28  # ids below are the specials and the 24 punctuation marks

# ids 4..27. Also handed to eSpeak as the punctuation set it must preserve. "<space>" is id 21.
PUNCTUATION = ';:,.!?¡¿—…"«»“”() *~-/\\&'
# ids 80..188, in the vocabulary's order. "'" appears twice (ids 185 and 187, around U+0329 at 186); the later
# entry wins when the lookup table is built, so an apostrophe always encodes to 187 and row 185 is never used.
_IPA = (  # letters; stress, length and modifier marks; tone arrows; the rest
    "ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢǀǁǂǃ"
    "ˈˌːˑʼʴʰʱʲʷˠˤ˞"
    "↓↑→↗↘"
    "'\u0329'ᵻ"
)  # fmt: skip
SYMBOLS: tuple[str, ...] = tuple(PUNCTUATION + string.ascii_uppercase + string.ascii_lowercase + _IPA)
VOCAB_SIZE: int = _NUM_SPECIAL + len(SYMBOLS)  # 189 rows of the phoneme embedding
# dict() keeps the last value for a repeated key: that is the apostrophe quirk described above.
SYMBOL_TO_ID: dict[str, int] = dict((s, i) for i, s in enumerate(SYMBOLS, start=_NUM_SPECIAL))

assert len(PUNCTUATION) == 24 and len(_IPA) == 109 and VOCAB_SIZE == 189
assert SYMBOL_TO_ID[PUNCTUATION[-1]] == _FIRST_SOUND_ID - 1 and SYMBOL_TO_ID["A"] == _FIRST_SOUND_ID


class EspeakNotFoundError(RuntimeError):
    """eSpeak-NG (the system library behind ``phonemizer``) is not installed or cannot be loaded."""


_ESPEAK_INSTALL_HINT = (
    "Zonos needs the eSpeak-NG library to turn text into phonemes. Install it with "
    "'sudo apt-get install espeak-ng' (Debian/Ubuntu), 'brew install espeak-ng' (macOS) or your system's "
    "package manager, or point PHONEMIZER_ESPEAK_LIBRARY at an existing libespeak-ng shared library "
    "(e.g. /usr/lib/x86_64-linux-gnu/libespeak-ng.so.1)."
)

# Homebrew installs outside the default library search path on macOS; help phonemizer find it.
_MAC_LIBRARIES = ("/opt/homebrew/lib/libespeak-ng.dylib", "/usr/local/lib/libespeak-ng.dylib")

_backends: dict[str, Any] = {}
# Creating a backend costs tens of ms and loads a private copy of libespeak; phonemizing is not documented as
# thread-safe. One lock covers both (phonemisation is a tiny part of a generation).
_lock = threading.Lock()


def encode_phonemes(phonemes: str) -> list[int]:
    """Map each Unicode code point (not grapheme) to its id; unknown code points become UNK (1). No BOS/EOS."""
    return [SYMBOL_TO_ID.get(ch, UNK_ID) for ch in phonemes]


def tokenize_phonemes(phonemes: Sequence[str]) -> tuple[torch.Tensor, list[int]]:
    """Encode a batch of phoneme strings as ``[BOS] + ids + [EOS]``, left-padded with PAD to the longest.

    Returns the int64 tensor ``[B, L]`` and the unpadded lengths (BOS/EOS included). No mask is produced: the
    model embeds pad positions with row 0 like any other token.
    """
    seqs = [[BOS_ID, *encode_phonemes(p), EOS_ID] for p in phonemes]
    if not seqs:
        raise ZonosInputError("tokenize_phonemes needs at least one phoneme string")
    lengths = [len(s) for s in seqs]
    longest = max(lengths)
    padded = [[PAD_ID] * (longest - len(s)) + s for s in seqs]
    return torch.tensor(padded, dtype=torch.long), lengths


def _espeak_backend_class() -> Any:
    """phonemizer's EspeakBackend class (imported lazily; a separate function so tests can replace it)."""
    if sys.platform == "darwin" and "PHONEMIZER_ESPEAK_LIBRARY" not in os.environ:
        for path in _MAC_LIBRARIES:
            if os.path.isfile(path):
                os.environ["PHONEMIZER_ESPEAK_LIBRARY"] = path
                break
    try:
        from phonemizer.backend import EspeakBackend
    except ImportError as e:
        raise MissingDependencyError(
            "the 'phonemizer' package is not installed: pip install phonemizer (it is a dependency of zonos-accel)"
        ) from e
    return EspeakBackend


def get_espeak_backend(language: str) -> Any:
    """The phonemizer eSpeak backend for ``language``, created once per language and cached.

    Settings: voice = ``language``, punctuation preserved (the 24 marks of :data:`PUNCTUATION`), stress marks on.
    Raises :class:`EspeakNotFoundError` when eSpeak-NG is missing and ValueError when it has no such voice.
    """
    backend = _backends.get(language)
    if backend is not None:
        return backend
    with _lock:
        if language in _backends:
            return _backends[language]
        backend_cls = _espeak_backend_class()
        # phonemizer warns (e.g. "words count mismatch") through this logger; those are harmless here.
        logger = logging.getLogger("zonos.phonemizer")
        logger.setLevel(logging.ERROR)
        try:
            backend = backend_cls(
                language,
                preserve_punctuation=True,
                with_stress=True,
                punctuation_marks=PUNCTUATION,
                logger=logger,
            )
        except RuntimeError as e:
            message = str(e)
            if "is not supported by the" in message:  # espeak runs but lacks this voice
                raise ZonosInputError(
                    f"the installed eSpeak-NG has no voice {language!r} ({message}); "
                    "upgrade espeak-ng or pick another language code"
                ) from e
            raise EspeakNotFoundError(f"{_ESPEAK_INSTALL_HINT} (phonemizer said: {message})") from e
        except OSError as e:  # a broken or incompatible library file
            raise EspeakNotFoundError(f"{_ESPEAK_INSTALL_HINT} (loading it failed: {e})") from e
        _backends[language] = backend
        return backend


def clear_espeak_cache() -> None:
    """Forget the cached eSpeak backends and phonemisations (e.g. after changing PHONEMIZER_ESPEAK_LIBRARY)."""
    with _lock:
        _backends.clear()
    _phonemize_cached.cache_clear()


def check_text(text: object, name: str = "text") -> str:
    """A text to speak: a ``str`` that is not blank, at most :data:`MAX_TEXT_CHARS` long, and encodes as UTF-8 (a
    lone surrogate such as ``'\\ud800'``, e.g. from a badly decoded command line, cannot reach eSpeak). Raises
    :class:`ZonosInputError`."""
    if not isinstance(text, str):
        raise ZonosInputError(f"{name} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ZonosInputError(
            f"{name} is empty (or only whitespace); pass the sentence to speak, e.g. text='Hello there.'"
        )
    if len(text) > MAX_TEXT_CHARS:
        raise ZonosInputError(
            f"{name} is {len(text)} characters, more than one generation can speak ({MAX_TEXT_CHARS}); split it "
            "with zonos.conditioning.segments.split_text and speak the pieces with zonos.longform.speak_segments"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ZonosInputError(
            f"{name} holds a lone surrogate {text[e.start]!r} at position {e.start}, which is not valid Unicode "
            "text; decode the input as UTF-8 (e.g. with errors='replace') or remove that character"
        ) from None
    return text


def has_phonemes(phonemes: str) -> bool:
    """Whether a phoneme string holds at least one sound: a letter or IPA symbol, not only punctuation,
    spaces and unknown code points."""
    return any(SYMBOL_TO_ID.get(ch, UNK_ID) >= _FIRST_SOUND_ID for ch in phonemes)


def check_phonemes(text: str, language: str, phonemes: str, name: str = "text") -> None:
    """Raise :class:`ZonosInputError` when ``text`` phonemised to no sound (``'\\u200b'``, ``'<>'``, ``'_'``,
    ``'\\x00'``...): the model would speak without text conditioning."""
    if not has_phonemes(phonemes):
        raise ZonosInputError(
            f"{name} {text[:40]!r} has nothing eSpeak can pronounce in language {language!r} (phonemes: "
            f"{phonemes!r}); pass words to speak, in the script of that language"
        )


def _phonemize_one(text: str, language: str) -> str:
    """One text's phonemes. The backend is looked up first, so the cache never answers for a backend that has
    since been replaced or cleared."""
    return _phonemize_cached(get_espeak_backend(language), text, language)


@functools.lru_cache(maxsize=256)
def _phonemize_cached(backend: Any, text: str, language: str) -> str:
    """Cached: ``make_cond_dict`` checks a text and the conditioner then embeds it, and a server sees the same
    short texts again and again (eSpeak's output is deterministic)."""
    normalized = normalize_text(text, language)
    with _lock:
        return backend.phonemize([normalized], strip=True)[0]


def _check_batch(texts: Sequence[str], languages: Sequence[str]) -> tuple[list[str], list[str]]:
    if isinstance(texts, str) or isinstance(languages, str):
        raise ZonosInputError("texts and languages must be lists of strings, e.g. (['Hello.'], ['en-us'])")
    try:
        texts, languages = list(texts), list(languages)
    except TypeError:
        raise ZonosInputError("texts and languages must be lists of strings, e.g. (['Hello.'], ['en-us'])") from None
    if len(languages) == 1 and len(texts) > 1:
        languages = languages * len(texts)  # one language for the whole batch
    if len(texts) != len(languages):
        raise ZonosInputError(f"got {len(texts)} texts but {len(languages)} languages; give one language per text")
    if not texts:
        raise ZonosInputError("no texts to phonemize")
    for i, (text, language) in enumerate(zip(texts, languages)):
        check_text(text, f"texts[{i}]")
        if not isinstance(language, str):
            raise ZonosInputError(f"languages[{i}] must be a string such as 'en-us', got {type(language).__name__}")
    return texts, [lang.lower() for lang in languages]


def phonemize(texts: Sequence[str], languages: Sequence[str]) -> list[str]:
    """Normalise and phonemise each text with the eSpeak voice of its language; one phoneme string per text."""
    texts, languages = _check_batch(texts, languages)
    return [_phonemize_one(text, language) for text, language in zip(texts, languages)]


def phonemize_text(texts: Sequence[str], languages: Sequence[str]) -> list[list[int]]:
    """Normalise + phonemise + encode each text: the ids the ``espeak`` conditioner embeds, one list per text.

    Each list **includes** BOS and EOS and is **not** padded, so ``len(ids)`` is exactly the number of prefix
    tokens the text contributes (the whole prefix is that plus one token per other conditioner).
    ``languages`` may hold one code for the whole batch.
    """
    return [[BOS_ID, *encode_phonemes(p), EOS_ID] for p in phonemize(texts, languages)]
