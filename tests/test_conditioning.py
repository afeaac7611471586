"""Tests for zonos.conditioning: normalisation, phonemes, conditioners, PrefixConditioner, make_cond_dict.

The golden phoneme file depends on the eSpeak-NG version; its phoneme checks are skipped under another version.
Regenerate it (after an intentional change, with espeak-ng 1.51) with:

    .venv/bin/python tests/test_conditioning.py --regenerate-golden
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # allow running as a script from anywhere for --regenerate-golden
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zonos.conditioning import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SYMBOL_TO_ID,
    UNK_ID,
    VOCAB_SIZE,
    EspeakNotFoundError,
    FourierConditioner,
    IntegerConditioner,
    MissingDependencyError,
    PassthroughConditioner,
    PrefixConditioner,
    encode_phonemes,
    make_cond_dict,
    normalize_numbers,
    normalize_text,
    phonemize,
    phonemize_text,
    supported_language_codes,
    tokenize_phonemes,
)
from zonos.conditioning import phonemes as phonemes_module  # noqa: E402
from zonos.config import PrefixConditionerConfig, ZonosConfig  # noqa: E402
from zonos.errors import ZonosInputError  # noqa: E402

GOLDEN_PATH = Path(__file__).parent / "data" / "phoneme_golden.json"
DATA = Path(__file__).parent / "data"  # copies of the shared reference facts, so a fresh clone is self-contained

# (language, text): numbers, currency, ordinals, decimals, years, punctuation, several languages.
GOLDEN_SENTENCES: list[tuple[str, str]] = [
    ("en-us", "Hello, world! How are you today?"),
    ("en-us", "In 1984, I paid $2.50 for 3.14 pounds of apples."),
    ("en-us", "The 21st century began in 2001; it's 2005 now, not 1900."),
    ("en-us", "She owes me £1,000 and $1.5, plus 1,000,000 thanks."),
    ("en-us", "Room 123, code 12345 — really… are you sure?"),
    ("en-us", "Quotes “like this” (and «these»), and/or * ~ & \\ stuff."),
    ("en-gb", "I'd like a cup of tea at half past 4, ta."),
    ("de", "Guten Morgen! Ich habe 3 Äpfel und 2 Birnen gekauft."),
    ("fr-fr", "Bonjour, je m'appelle Zonos. C'est génial, n'est-ce pas ?"),
    ("es", "¿Dónde está la biblioteca? ¡Muy bien!"),
    ("cmn", "你好，世界。"),
]

# The hybrid config's conditioner list (the transformer uses the first seven).
HYBRID_CONDITIONERS: list[dict] = [
    {"type": "EspeakPhonemeConditioner", "name": "espeak"},
    {
        "cond_dim": 128,
        "uncond_type": "learned",
        "projection": "linear",
        "type": "PassthroughConditioner",
        "name": "speaker",
    },
    {"input_dim": 8, "uncond_type": "learned", "type": "FourierConditioner", "name": "emotion"},
    {"min_val": 0, "max_val": 24000, "uncond_type": "learned", "type": "FourierConditioner", "name": "fmax"},
    {"min_val": 0, "max_val": 400, "uncond_type": "learned", "type": "FourierConditioner", "name": "pitch_std"},
    {"min_val": 0, "max_val": 40, "uncond_type": "learned", "type": "FourierConditioner", "name": "speaking_rate"},
    {"min_val": -1, "max_val": 126, "uncond_type": "learned", "type": "IntegerConditioner", "name": "language_id"},
    {
        "input_dim": 8,
        "min_val": 0.5,
        "max_val": 0.8,
        "uncond_type": "learned",
        "type": "FourierConditioner",
        "name": "vqscore_8",
    },
    {"min_val": -1.0, "max_val": 1000, "uncond_type": "learned", "type": "FourierConditioner", "name": "ctc_loss"},
    {"min_val": 1, "max_val": 5, "uncond_type": "learned", "type": "FourierConditioner", "name": "dnsmos_ovrl"},
    {"min_val": 0, "max_val": 1, "uncond_type": "learned", "type": "IntegerConditioner", "name": "speaker_noised"},
]


def _config(kind: str) -> PrefixConditionerConfig:
    conds = HYBRID_CONDITIONERS if kind == "hybrid" else HYBRID_CONDITIONERS[:7]
    return PrefixConditionerConfig(conditioners=[dict(c) for c in conds], projection="linear")


def _espeak_version() -> str:
    from phonemizer.backend import EspeakBackend

    return ".".join(map(str, EspeakBackend.version()))


def _make_golden() -> dict:
    langs = [lang for lang, _ in GOLDEN_SENTENCES]
    texts = [text for _, text in GOLDEN_SENTENCES]
    phones = phonemize(texts, langs)
    return {
        "espeak_ng_version": _espeak_version(),
        "note": "regenerate with: python tests/test_conditioning.py --regenerate-golden",
        "entries": [
            {
                "language": lang,
                "text": text,
                "normalized": normalize_text(text, lang),
                "phonemes": ph,
                "ids": [BOS_ID, *encode_phonemes(ph), EOS_ID],
            }
            for (lang, text), ph in zip(GOLDEN_SENTENCES, phones)
        ],
    }


# --- (1) golden phonemes ---------------------------------------------------------------------------------------


def test_golden_phonemes() -> None:
    golden = json.loads(GOLDEN_PATH.read_text(encoding="utf-8"))
    entries = golden["entries"]
    assert [(e["language"], e["text"]) for e in entries] == GOLDEN_SENTENCES, "golden file is stale: regenerate"
    for e in entries:  # normalisation does not depend on eSpeak
        assert normalize_text(e["text"], e["language"]) == e["normalized"], e["text"]
    if _espeak_version() != golden["espeak_ng_version"]:
        pytest.skip(f"golden phonemes made with espeak-ng {golden['espeak_ng_version']}, have {_espeak_version()}")
    ids = phonemize_text([e["text"] for e in entries], [e["language"] for e in entries])
    for e, got in zip(entries, ids):
        assert got == e["ids"], (e["text"], e["phonemes"])
    assert phonemize([entries[0]["text"]], ["en-us"]) == [entries[0]["phonemes"]]


# --- (2) normalisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1984", "nineteen eighty-four"),
        ("2005", "two thousand five"),
        ("1900", "nineteen hundred"),
        ("2000", "two thousand"),
        ("1905", "nineteen oh five"),
        ("1,000,000", "one million"),
        ("£1,000", "one thousand pounds"),
        ("$1.5", "one dollar, five cents"),
        ("$2.50", "two dollars, fifty cents"),
        ("$1", "one dollar"),
        ("$0.01", "one cent"),
        ("$0.00", "zero dollars"),
        ("3.14", "three point fourteen"),
        ("21st", "twenty-first"),
        ("123", "one hundred twenty-three"),
        ("12345", "twelve thousand, three hundred forty-five"),
        ("no digits here.", "no digits here."),
    ],
)
def test_normalize_numbers(text: str, expected: str) -> None:
    assert normalize_numbers(text) == expected


def test_non_english_languages_use_english_number_rules() -> None:
    assert normalize_text("3 Äpfel", "de") == "three Äpfel"


def test_japanese_needs_optional_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kanjize", None)  # makes "import kanjize" fail even if installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'zonos-accel\[ja\]'"):
        normalize_text("今日は1日", "ja")


# --- (3) symbol table and tokenisation ------------------------------------------------------------------------


def test_example_tokenization() -> None:
    ids, lengths = tokenize_phonemes(["həlˈoʊ wˈɜːld!"])
    assert ids.tolist() == [[2, 61, 94, 65, 167, 68, 146, 21, 76, 167, 98, 169, 65, 57, 8, 3]]
    assert ids.dtype == torch.long and lengths == [16]


def test_left_padding_and_unknown() -> None:
    ids, lengths = tokenize_phonemes(["ab", "a", "\u4e00"])
    assert lengths == [4, 3, 3]
    assert ids.tolist() == [
        [BOS_ID, 54, 55, EOS_ID],
        [PAD_ID, BOS_ID, 54, EOS_ID],
        [PAD_ID, BOS_ID, UNK_ID, EOS_ID],
    ]


def test_symbol_table() -> None:
    assert VOCAB_SIZE == 189
    assert SYMBOL_TO_ID["'"] == 187 and 185 not in SYMBOL_TO_ID.values()
    assert SYMBOL_TO_ID[";"] == 4 and SYMBOL_TO_ID[" "] == 21 and SYMBOL_TO_ID["&"] == 27
    assert SYMBOL_TO_ID["A"] == 28 and SYMBOL_TO_ID["z"] == 79 and SYMBOL_TO_ID["ᵻ"] == 188
    tsv = DATA / "phoneme_symbols.tsv"
    for line in tsv.read_text(encoding="utf-8").splitlines()[1:]:
        idx, codepoint, *_rest, status = line.split("\t")
        if codepoint == "-":
            continue
        expected = 187 if status.startswith("shadowed") else int(idx)
        assert SYMBOL_TO_ID[chr(int(codepoint[2:], 16))] == expected, line


def test_supported_language_codes() -> None:
    assert len(supported_language_codes) == 109
    assert supported_language_codes[0] == "af" and supported_language_codes[24] == "en-us"
    assert supported_language_codes[-1] == "yue"
    rows = [line.split("\t") for line in (DATA / "language_codes.tsv").read_text().splitlines()[1:]]
    assert supported_language_codes == [code for _, code, _ in rows]


# --- (4) checkpoint names and shapes -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["zonos-v0.1-hybrid", "zonos-v0.1-transformer"])
def test_state_dict_matches_checkpoint(model: str) -> None:
    config = ZonosConfig.from_json(DATA / f"{model}_config.json")
    kind = "hybrid" if "hybrid" in model else "transformer"
    assert config.prefix_conditioner.conditioners == _config(kind).conditioners
    with torch.device("meta"):
        pc = PrefixConditioner(config.prefix_conditioner, config.backbone.d_model)
    got = [(k, "x".join(map(str, v.shape)) or "scalar") for k, v in pc.state_dict().items()]
    expected = []
    for line in (DATA / f"{model}_state_dict.tsv").read_text().splitlines()[1:]:
        name, shape, _dtype = line.split("\t")
        if name.startswith("prefix_conditioner."):
            expected.append((name.removeprefix("prefix_conditioner."), shape))
    assert got == expected  # same names, shapes and registration order
    # Fourier weights are buffers (not learned), but persistent: they must load from the checkpoint.
    params = dict(pc.named_parameters())
    assert "conditioners.2.weight" not in params and "conditioners.2.weight" in dict(pc.named_buffers())
    assert pc.required_keys == {"espeak"}


# --- (5) prefix assembly and make_cond_dict ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hello_ids() -> list[int]:
    return phonemize_text(["Hello world!"], ["en-us"])[0]


@pytest.mark.parametrize(("kind", "extra"), [("hybrid", 10), ("transformer", 6)])
def test_prefix_length(kind: str, extra: int, hello_ids: list[int]) -> None:
    torch.manual_seed(0)
    pc = PrefixConditioner(_config(kind), 32)
    out = pc(make_cond_dict("Hello world!", device="cpu"))
    assert out.shape == (1, len(hello_ids) + extra, 32) and out.dtype == torch.float32
    assert pc.prefix_length(len(hello_ids)) == len(hello_ids) + extra


def test_prefix_batch_broadcast_and_uncond(hello_ids: list[int]) -> None:
    torch.manual_seed(0)
    pc = PrefixConditioner(_config("hybrid"), 32)
    with torch.no_grad():
        for c in pc.conditioners[1:]:
            c.uncond_vector.normal_()
    cond = make_cond_dict("Hello world!", speaker=torch.randn(128), device="cpu")
    single = pc(cond)
    batch = pc({**cond, "espeak": (["Hello world!", "Hi."], ["en-us"])})
    n = len(hello_ids)
    assert batch.shape == (2, n + 10, 32)
    torch.testing.assert_close(batch[0], single[0])  # the longest text is not padded
    torch.testing.assert_close(batch[1, -10:], single[0, -10:])  # batch-1 tokens broadcast
    # Left padding: "Hi." is shorter, so row 1 starts with PAD embeddings.
    pad_token = pc.norm(pc.project(pc.conditioners[0].phoneme_embedder.weight[PAD_ID]))
    torch.testing.assert_close(batch[1, 0], pad_token)
    # vqscore_8 (index 7 -> position n + 6) and dnsmos_ovrl (n + 8) are unconditional by default.
    for idx, pos in ((7, n + 6), (9, n + 8)):
        expected = pc.norm(pc.project(pc.conditioners[idx].uncond_vector))
        torch.testing.assert_close(single[0, pos], expected)
    # a key set to None also selects the learned vector (speaker, position n)
    no_spk = pc({**cond, "speaker": None})
    torch.testing.assert_close(no_spk[0, n], pc.norm(pc.project(pc.conditioners[1].uncond_vector)))
    # pre-tokenised ids give the same prefix as text
    ids, _ = tokenize_phonemes(phonemize(["Hello world!"], ["en-us"]))
    torch.testing.assert_close(pc({**cond, "espeak": ids}), single)


def test_make_cond_dict_defaults() -> None:
    d = make_cond_dict("Hello.", language="EN-US", device="cpu")
    assert d["espeak"] == (["Hello."], ["en-us"])
    assert d["speaker"] is None
    assert "vqscore_8" not in d and "dnsmos_ovrl" not in d
    expected = {
        "emotion": 8,
        "fmax": 1,
        "pitch_std": 1,
        "speaking_rate": 1,
        "language_id": 1,
        "ctc_loss": 1,
        "speaker_noised": 1,
    }
    for key, n in expected.items():
        assert d[key].shape == (1, 1, n), key
        assert d[key].dtype == (torch.long if key in ("language_id", "speaker_noised") else torch.float32), key
        assert d[key].device.type == "cpu"
    assert d["language_id"].item() == 24 and d["speaker_noised"].item() == 0
    assert math.isclose(d["emotion"].sum().item(), 1.0, rel_tol=1e-6)
    assert d["fmax"].item() == 22050.0

    spk = torch.randn(1, 128, dtype=torch.bfloat16)
    d = make_cond_dict(
        "Hi", "de", speaker=spk, emotion=[1, 0, 0, 0, 0, 0, 0, 1], unconditional_keys=["emotion"], speaker_noised=True
    )
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert d["speaker"].shape == (1, 1, 128) and d["speaker"].dtype == torch.bfloat16
    assert d["speaker"].device.type == default_device
    assert "emotion" not in d and "vqscore_8" in d and d["vqscore_8"].shape == (1, 1, 8)
    assert d["language_id"].item() == 16 and d["speaker_noised"].item() == 1
    d = make_cond_dict("Hi", emotion=[2, 0, 0, 0, 0, 0, 0, 2], device="cpu")
    assert d["emotion"][0, 0, 0].item() == 0.5


# --- (6) conditioner formulas ---------------------------------------------------------------------------------


def test_fourier_formula() -> None:
    torch.manual_seed(0)
    fc = FourierConditioner(32, "vq", input_dim=8, min_val=0.5, max_val=0.8, uncond_type="learned")
    x = torch.rand(1, 1, 8)
    x_hat = (x - 0.5) / 0.3
    f = torch.stack([2 * math.pi * sum(x_hat[0, 0, j] * fc.weight[i, j] for j in range(8)) for i in range(16)])
    expected = torch.cat([f.cos(), f.sin()]).view(1, 1, 32)
    torch.testing.assert_close(fc(x), expected, atol=1e-5, rtol=1e-5)
    assert fc(torch.zeros(3, 8)).shape == (3, 1, 32)  # [B, n] -> [B, 1, d]
    # bf16 module: x̂ in fp32, cast to bf16, then (2π x̂) Wᵀ in bf16.
    fc_bf16 = FourierConditioner(32, "vq", input_dim=8, min_val=0.5, max_val=0.8).to(torch.bfloat16)
    g = (2 * math.pi * x_hat.to(torch.bfloat16)) @ fc_bf16.weight.T
    out = fc_bf16(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, torch.cat([g.cos(), g.sin()], -1), atol=0, rtol=0)
    assert fc(None).shape == (1, 1, 32) and torch.equal(fc(None)[0, 0], fc.uncond_vector)


def test_integer_formula() -> None:
    ic = IntegerConditioner(32, "language_id", min_val=-1, max_val=126, uncond_type="learned")
    assert ic.int_embedder.weight.shape == (128, 32)
    out = ic(torch.tensor([[[24]]]))
    torch.testing.assert_close(out, ic.int_embedder.weight[25].view(1, 1, 32))
    with pytest.raises(ValueError, match=r"\[-1, 126\]"):
        ic(torch.tensor([[[127]]]))


@pytest.mark.parametrize("projection", ["linear", "mlp"])
def test_passthrough_formula(projection: str) -> None:
    pt = PassthroughConditioner(32, "speaker", cond_dim=128, projection=projection, uncond_type="learned")
    s = torch.randn(1, 1, 128)
    if projection == "linear":
        expected = s @ pt.project.weight.T + pt.project.bias
    else:
        h = torch.nn.functional.silu(s @ pt.project[0].weight.T + pt.project[0].bias)
        expected = h @ pt.project[2].weight.T + pt.project[2].bias
    torch.testing.assert_close(pt(s), expected)
    assert pt(s.to(torch.bfloat16)).dtype == torch.float32  # the input follows the module's dtype
    with pytest.raises(ValueError, match="128 value"):
        pt(torch.randn(1, 1, 127))


# --- (7) bad inputs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"text": ""}, "text is empty"),
        ({"text": "   \n"}, "text is empty"),
        ({"language": "en"}, "en-gb, en-us"),
        ({"language": "klingon"}, "unsupported language 'klingon'"),
        ({"emotion": [0.5] * 7}, "emotion must be 8 numbers"),
        ({"emotion": [0.0] * 8}, "sum to 0"),
        ({"speaker": torch.zeros(127)}, "speaker must hold 128 values"),
        ({"speaker": [0.0] * 64}, "speaker must be 128 numbers"),
        ({"vqscore_8": [0.7] * 4, "unconditional_keys": ()}, "vqscore_8 must be 8 numbers"),
        ({"fmax": "high"}, "fmax must be a single number"),
        ({"pitch_std": [20.0, 30.0]}, "pitch_std must be a single number, got 2 values"),
        ({"ctc_loss": float("nan")}, "ctc_loss must be finite"),
        ({"unconditional_keys": {"vqscore8"}}, r"unknown unconditional key\(s\) \['vqscore8'\]"),
        ({"unconditional_keys": {"espeak"}}, "cannot be unconditional.*remove it from unconditional_keys"),
    ],
)
def test_make_cond_dict_errors(kwargs: dict, pattern: str) -> None:
    kwargs = {"text": "Hello.", "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=pattern):
        make_cond_dict(**kwargs)


def test_prefix_errors() -> None:
    pc = PrefixConditioner(_config("transformer"), 32)
    with pytest.raises(ValueError, match=r"required key\(s\) \['espeak'\]"):
        pc({"fmax": torch.tensor([[[22050.0]]])})
    with pytest.raises(ValueError, match="expects 8 value"):
        pc({"espeak": (["Hi"], ["en-us"]), "emotion": torch.ones(1, 1, 7)})
    with pytest.raises(ValueError, match="expects \\(texts, languages\\)"):
        pc({"espeak": "Hi"})
    with pytest.raises(ValueError, match="type 'Nope'"):
        PrefixConditioner(PrefixConditionerConfig([{"type": "Nope", "name": "x"}]), 32)


def test_missing_espeak_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real failure path: phonemizer cannot load the library PHONEMIZER_ESPEAK_LIBRARY points to.
    monkeypatch.setattr(phonemes_module, "_backends", {})
    monkeypatch.setenv("PHONEMIZER_ESPEAK_LIBRARY", "/nonexistent/libespeak-ng.so")
    with pytest.raises(EspeakNotFoundError) as info:
        phonemize_text(["Hello"], ["en-us"])
    message = str(info.value)
    assert "apt-get install espeak-ng" in message and "brew install espeak-ng" in message
    assert "PHONEMIZER_ESPEAK_LIBRARY" in message

    # A backend factory that fails the way phonemizer does when no espeak is installed at all.
    class NoEspeak:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("espeak not installed on your system")

    monkeypatch.delenv("PHONEMIZER_ESPEAK_LIBRARY")
    monkeypatch.setattr(phonemes_module, "_espeak_backend_class", lambda: NoEspeak)
    with pytest.raises(EspeakNotFoundError, match="apt-get install espeak-ng"):
        phonemize_text(["Hello"], ["de"])


def test_espeak_voice_missing_is_value_error() -> None:
    with pytest.raises(ValueError, match="no voice 'xx-nope'"):
        phonemize(["Hello"], ["xx-nope"])


def test_phonemize_batch_errors() -> None:
    with pytest.raises(ValueError, match="2 texts but 3 languages"):
        phonemize_text(["a", "b"], ["en-us", "de", "fr-fr"])
    with pytest.raises(ValueError, match="lists of strings"):
        phonemize_text("Hello", "en-us")  # type: ignore[arg-type]


# --- (6) input validation (issue: no input gives silent wrong audio or a raw traceback) --------------------------


@pytest.mark.parametrize("text", ["\u200b", "<>", "_", "\x00", "...", "\u200b\u200b!"])
def test_text_without_sounds_is_refused(text: str) -> None:
    with pytest.raises(ZonosInputError, match="nothing eSpeak can pronounce"):
        make_cond_dict(text=text, device="cpu")
    pc = PrefixConditioner(_config("transformer"), 32)  # a hand-built cond dict is checked too
    with pytest.raises(ZonosInputError, match="nothing eSpeak can pronounce"):
        pc({"espeak": ([text], ["en-us"])})


def test_lone_surrogate_is_refused_clearly() -> None:
    with pytest.raises(ZonosInputError, match=r"lone surrogate '\\udc80' at position 5"):
        make_cond_dict(text="Hello\udc80 world", device="cpu")
    with pytest.raises(ZonosInputError, match="lone surrogate"):
        phonemize(["\ud800"], ["en-us"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_speaker_tensor_is_refused(bad: float) -> None:
    speaker = torch.randn(128)
    speaker[17] = bad
    with pytest.raises(ZonosInputError, match="speaker contains 1 NaN or infinite"):
        make_cond_dict(text="Hello.", speaker=speaker.to(torch.bfloat16), device="cpu")
    pc = PrefixConditioner(_config("transformer"), 32)
    with pytest.raises(ZonosInputError, match="NaN or infinite"):
        pc({"espeak": (["Hello."], ["en-us"]), "speaker": speaker.view(1, 1, 128)})


def test_speaker_tensor_must_be_floating() -> None:
    with pytest.raises(ZonosInputError, match="floating-point embedding"):
        make_cond_dict(text="Hello.", speaker=torch.ones(128, dtype=torch.bool), device="cpu")


def test_emotion_weights_non_negative_with_positive_sum() -> None:
    with pytest.raises(ZonosInputError, match="emotion weights must be >= 0"):
        make_cond_dict(text="Hello.", emotion=[1, 0, 0, 0, 0, 0, 0, -0.5], device="cpu")
    with pytest.raises(ZonosInputError, match="emotion must be finite"):
        make_cond_dict(text="Hello.", emotion=[1e39] * 8, device="cpu")  # inf once in float32
    # Near the float32 limit the sum used to overflow, turning the vector into zeros.
    emotion = make_cond_dict(text="Hello.", emotion=[3e38] * 8, device="cpu")["emotion"]
    assert torch.allclose(emotion, torch.full((1, 1, 8), 0.125)) and emotion.dtype == torch.float32
    tiny = make_cond_dict(text="Hello.", emotion=[1e-30, 0, 0, 0, 0, 0, 0, 3e-30], device="cpu")["emotion"]
    assert torch.allclose(tiny.flatten()[[0, 7]], torch.tensor([0.25, 0.75]))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"fmax": True}, "fmax must be a single number, got True"),
        ({"pitch_std": "20"}, "pitch_std must be a single number, got '20'"),
        ({"speaking_rate": None, "unconditional_keys": ()}, None),  # None means unconditional: allowed
        ({"speaking_rate": float("inf")}, "speaking_rate must be finite"),
        ({"emotion": ["1"] * 8}, "emotion must be 8 numbers"),
        ({"emotion": [True] * 8}, "emotion must be 8 numbers"),
        ({"vqscore_8": torch.full((8,), float("nan")), "unconditional_keys": ()}, "vqscore_8 must be finite"),
        ({"speaker_noised": 2}, "speaker_noised must be True or False"),
        ({"speaker_noised": "yes"}, "speaker_noised must be True or False"),
        ({"text": 5}, "text must be a string"),
        ({"language": None}, "language must be a string"),
        ({"unconditional_keys": 5}, "unconditional_keys must be a list"),
        ({"device": "mps"} if not torch.backends.mps.is_available() else {"device": "nope"}, "not"),
    ],
)
def test_make_cond_dict_refuses_wrong_types(kwargs: dict, pattern: str | None) -> None:
    kwargs = {"text": "Hello.", "device": "cpu", **kwargs}
    if pattern is None:
        make_cond_dict(**kwargs)
        return
    with pytest.raises(ZonosInputError, match=pattern):
        make_cond_dict(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [  # vqscore_8 and dnsmos_ovrl are unconditional by default; the others are made so
        ({"vqscore_8": [float("nan")] * 8}, r"vqscore_8 must be finite"),
        ({"vqscore_8": [0.7] * 4}, "vqscore_8 must be 8 numbers"),
        ({"dnsmos_ovrl": float("inf")}, "dnsmos_ovrl must be finite"),
        ({"dnsmos_ovrl": "high"}, "dnsmos_ovrl must be a single number"),
        ({"speaker": torch.zeros(5), "unconditional_keys": ["speaker"]}, "speaker must hold 128 values"),
        ({"emotion": [-1.0] * 8, "unconditional_keys": "emotion"}, "emotion weights must be >= 0"),
        ({"fmax": float("nan"), "unconditional_keys": ["fmax"]}, "fmax must be finite"),
        ({"speaker_noised": 2, "unconditional_keys": ["speaker_noised"]}, "speaker_noised must be True or False"),
    ],
)
def test_values_of_unconditional_keys_are_checked(kwargs: dict, pattern: str) -> None:
    """A dropped key's value goes unused, but a bad one is still the caller's mistake."""
    with pytest.raises(ZonosInputError, match=pattern):
        make_cond_dict(text="Hello.", device="cpu", **kwargs)


def test_unconditional_keys_drop_checked_values() -> None:
    kept = make_cond_dict(text="Hello.", vqscore_8=[0.6] * 8, unconditional_keys=(), device="cpu")
    d = make_cond_dict(text="Hello.", vqscore_8=[0.6] * 8, unconditional_keys=["speaker", "fmax"], device="cpu")
    assert set(kept) - set(d) == {"speaker", "fmax"} and "vqscore_8" in d
    assert torch.equal(d["vqscore_8"], kept["vqscore_8"])
    d = make_cond_dict(text="Hello.", speaker=None, fmax=None, unconditional_keys=iter(["speaker"]), device="cpu")
    assert "speaker" not in d and "fmax" not in d and "vqscore_8" in d  # None drops a key too


@pytest.mark.parametrize(
    ("keys", "pattern"),
    [
        (5, r"unconditional_keys must be a list of key names \(or one name\), got int 5"),
        (b"speaker", "unconditional_keys must be a list of key names .* got bytes"),
        ({"speaker": True}, "unconditional_keys must be a list of key names .* got dict"),  # not read as flags
        (torch.tensor(3), "unconditional_keys must be a list of key names .* got Tensor"),
        ([1], r"unconditional_keys must hold key names \(strings\), got 1 \(int\)"),
        ([["speaker"]], r"unconditional_keys must hold key names \(strings\), got \['speaker'\] \(list\)"),
        (["speaker", None], r"got None \(NoneType\)"),
        (["speaker", "mood", "fmax2"], r"unknown unconditional key\(s\) \['fmax2', 'mood'\]"),
    ],
)
def test_unconditional_keys_are_checked(keys, pattern: str) -> None:
    with pytest.raises(ZonosInputError, match=pattern) as info:
        make_cond_dict(text="Hello.", unconditional_keys=keys, device="cpu")
    assert "speaker, emotion, fmax, pitch_std, speaking_rate, language_id, vqscore_8, ctc_loss, " in str(info.value)


def test_conditioner_inputs_are_checked() -> None:
    pc = PrefixConditioner(_config("hybrid"), 32)
    good = make_cond_dict(text="Hello.", device="cpu")
    for key, value, pattern in [
        ("pitch_std", torch.tensor([[[float("nan")]]]), "NaN or infinite"),
        ("pitch_std", "high", "expects numbers"),
        ("emotion", torch.ones(1, 1, 8, dtype=torch.bool), "real numbers"),
        ("language_id", torch.tensor([[[0.5]]]), "takes integers"),
        ("language_id", torch.tensor([[[1e30]]]), "takes integers"),
        ("espeak", torch.tensor([[2, 500, 3]]), "phoneme ids in 0..188"),
        ("espeak", torch.tensor([[2.0, 3.0]]), "integer tensor"),
    ]:
        with pytest.raises(ZonosInputError, match=pattern):
            pc({**good, key: value})
    with pytest.raises(ZonosInputError, match="cond_dict must be a dict"):
        pc([("espeak", (["Hi"], ["en-us"]))])


def test_japanese_without_the_extra_is_a_clear_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kanjize", None)
    with pytest.raises(ZonosInputError, match=r"pip install 'zonos-accel\[ja\]'") as info:
        make_cond_dict(text="今日は", language="ja", device="cpu")
    assert isinstance(info.value, MissingDependencyError) and isinstance(info.value, ImportError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1" * 37, " ".join(["one"] * 37)),
        ("9" * 36, None),  # the longest number inflect spells: still words, not digits
        ("0" * 3 + "7" * 37, " ".join(["zero"] * 3 + ["seven"] * 37)),
        ("4" * 5000, " ".join(["four"] * 5000)),  # past Python's 4300-digit int() limit
        ("$" + "2" * 40, " ".join(["two"] * 40) + " dollars"),
        ("5" * 40 + "th", " ".join(["five"] * 40) + " th"),
        (",".join(str(i) for i in range(1, 26)), None),
        ("1,2,3", "one,two,three"),
        ("1,000,000 and 12,345", "one million and twelve thousand, three hundred forty-five"),
    ],
)
def test_number_normalizer_never_raises(text: str, expected: str | None) -> None:
    out = normalize_numbers(text)
    assert not any(ch.isdigit() for ch in out)
    if expected is not None:
        assert out == expected
    if text.startswith("1,2,3,4"):
        assert out.startswith("one,two,three,four,") and out.endswith("twenty-four,twenty-five")


def test_prefix_that_overflows_is_refused() -> None:
    """A finite but huge speaker embedding overflows float32 in the prefix norm: refused, not a NaN prefix."""
    pc = PrefixConditioner(_config("hybrid"), 32)
    cond = make_cond_dict(text="Hello.", speaker=torch.full((128,), 1e30), device="cpu")
    with pytest.raises(ZonosInputError, match="prefix came out NaN or infinite"):
        pc(cond)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--regenerate-golden", action="store_true", help=f"rewrite {GOLDEN_PATH}")
    if parser.parse_args().regenerate_golden:
        GOLDEN_PATH.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN_PATH.write_text(json.dumps(_make_golden(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN_PATH}")
    else:
        parser.print_help()


def test_text_past_one_generation_is_refused_before_phonemizing() -> None:
    """More than MAX_TEXT_CHARS cannot fit one generation; refused in microseconds, before eSpeak (whose cost grows
    faster than the length) sees it, with the pointer to split_text."""
    import time

    from zonos.conditioning.phonemes import MAX_TEXT_CHARS

    t0 = time.perf_counter()
    with pytest.raises(ZonosInputError, match=f"{MAX_TEXT_CHARS + 1} characters.*split_text"):
        make_cond_dict(text="a" * (MAX_TEXT_CHARS + 1), device="cpu")
    assert time.perf_counter() - t0 < 0.05


def test_numbers_past_float_range_and_mismatched_uncond_are_input_errors(tmp_path) -> None:
    from tests.tiny import tiny_model

    for big in (10**400, 1e39, float("nan")):  # past float, past float32, not a number
        with pytest.raises(ZonosInputError, match="fmax must be finite"):
            make_cond_dict(text="Hi there.", fmax=big, device="cpu")
    with pytest.raises(ZonosInputError, match="emotion must be"):
        make_cond_dict(text="Hi there.", emotion=[10**400] * 8, device="cpu")
    model = tiny_model(tmp_path)
    cond = make_cond_dict(text="Hi there.", device="cpu")
    with pytest.raises(ZonosInputError, match="give uncond_dict the same text"):
        model.prepare_conditioning(cond, make_cond_dict(text="A different, longer text.", device="cpu"))
