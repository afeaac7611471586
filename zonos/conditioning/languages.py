"""The 109 language codes Zonos v0.1 was trained with.

A code's position in :data:`supported_language_codes` is its ``language_id`` (0-based); the ``language_id``
conditioner looks up embedding row ``language_id + 1`` because its table starts at -1. The same code string is
handed to eSpeak-NG as the voice name.
"""

from __future__ import annotations

import difflib

from zonos.errors import ZonosInputError

# Order matters: it defines language_id and therefore which embedding row the checkpoint uses.
supported_language_codes: list[str] = """
af am an ar as az ba bg bn bpy bs ca cmn cs cy da de el en-029 en-gb en-gb-scotland en-gb-x-gbclan
en-gb-x-gbcwmd en-gb-x-rp en-us eo es es-419 et eu fa fa-latn fi fr-be fr-ch fr-fr ga gd gn grc gu hak hi hr
ht hu hy hyw ia id is it ja jbo ka kk kl kn ko kok ku ky la lfn lt lv mi mk ml mr ms mt my nb nci ne nl om or
pa pap pl pt pt-br py quc ro ru ru-lv sd shn si sk sl sq sr sv sw ta te tn tr tt ur uz vi vi-vn-x-central
vi-vn-x-south yue
""".split()

_CODE_TO_ID: dict[str, int] = {code: i for i, code in enumerate(supported_language_codes)}

# A few language *names* people type instead of codes, only used for "did you mean" hints.
_NAME_HINTS: dict[str, str] = {
    "english": "en-us",
    "american": "en-us",
    "british": "en-gb",
    "german": "de",
    "french": "fr-fr",
    "spanish": "es",
    "italian": "it",
    "portuguese": "pt",
    "japanese": "ja",
    "chinese": "cmn",
    "mandarin": "cmn",
    "cantonese": "yue",
    "korean": "ko",
    "russian": "ru",
    "dutch": "nl",
    "polish": "pl",
    "hindi": "hi",
    "arabic": "ar",
    "turkish": "tr",
}


def suggest_language_codes(language: str, limit: int = 6) -> list[str]:
    """Supported codes that look like ``language`` (regional variants first, then near spellings)."""
    query = str(language).strip().lower().replace("_", "-")
    found: list[str] = []
    if query in _NAME_HINTS:
        found.append(_NAME_HINTS[query])
    if query in _CODE_TO_ID:
        found.append(query)
    # "en" -> every "en-*" variant; shorter (more common) variants first, en-us/en-gb before en-gb-x-rp.
    found += sorted((c for c in supported_language_codes if c.startswith(query + "-")), key=lambda c: (len(c), c))
    # "en-au" -> "en", then its variants; "english" -> nothing here, difflib below.
    base = query.split("-")[0]
    if base != query:
        found += [c for c in supported_language_codes if c == base or c.startswith(base + "-")]
    found += difflib.get_close_matches(query, supported_language_codes, n=limit, cutoff=0.6)
    unique = list(dict.fromkeys(found))
    return unique[:limit]


def normalize_language(language: str) -> str:
    """Return the supported code for ``language`` (lower-cased), or raise a ValueError that suggests codes.

    Upper case is accepted (``"EN-US"`` -> ``"en-us"``); anything else must match a code exactly, because the
    code selects both an eSpeak voice and a learned embedding row.
    """
    if not isinstance(language, str):
        raise ZonosInputError(f"language must be a string such as 'en-us', got {type(language).__name__}")
    code = language.strip().lower()
    if code in _CODE_TO_ID:
        return code
    hints = suggest_language_codes(language)
    hint = f" Did you mean {', '.join(hints)}?" if hints else ""
    raise ZonosInputError(
        f"unsupported language {language!r}.{hint} "
        f"Use one of the {len(supported_language_codes)} codes in zonos.conditioning.supported_language_codes."
    )


def language_id(language: str) -> int:
    """The ``language_id`` (0..108) of a supported code; raises ValueError for unknown codes."""
    return _CODE_TO_ID[normalize_language(language)]
