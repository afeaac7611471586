"""Conditioning: text normalisation, eSpeak phonemes, the conditioner modules and ``make_cond_dict``.

Typical use::

    from zonos.conditioning import make_cond_dict
    cond = make_cond_dict(text="Hello, world!", language="en-us", speaker=embedding)
    prefix = model.prefix_conditioner(cond)          # [1, L + 10, d] for the hybrid model
"""

from .conditioners import (
    COND_KEYS,
    DEFAULT_EMOTION,
    Conditioner,
    EspeakPhonemeConditioner,
    FourierConditioner,
    IntegerConditioner,
    PassthroughConditioner,
    PrefixConditioner,
    build_conditioners,
    make_cond_dict,
)
from .languages import language_id, normalize_language, supported_language_codes
from .phonemes import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SYMBOL_TO_ID,
    SYMBOLS,
    UNK_ID,
    VOCAB_SIZE,
    EspeakNotFoundError,
    clear_espeak_cache,
    encode_phonemes,
    get_espeak_backend,
    phonemize,
    phonemize_text,
    tokenize_phonemes,
)
from .text_normalization import MissingDependencyError, normalize_japanese, normalize_numbers, normalize_text

__all__ = [
    "BOS_ID",
    "COND_KEYS",
    "Conditioner",
    "DEFAULT_EMOTION",
    "EOS_ID",
    "EspeakNotFoundError",
    "EspeakPhonemeConditioner",
    "FourierConditioner",
    "IntegerConditioner",
    "MissingDependencyError",
    "PAD_ID",
    "PassthroughConditioner",
    "PrefixConditioner",
    "SYMBOLS",
    "SYMBOL_TO_ID",
    "UNK_ID",
    "VOCAB_SIZE",
    "build_conditioners",
    "clear_espeak_cache",
    "encode_phonemes",
    "get_espeak_backend",
    "language_id",
    "make_cond_dict",
    "normalize_japanese",
    "normalize_language",
    "normalize_numbers",
    "normalize_text",
    "phonemize",
    "phonemize_text",
    "supported_language_codes",
    "tokenize_phonemes",
]
