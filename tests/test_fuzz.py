"""Seeded random cases over the public API on tiny models: every call either succeeds with finite, in-range
output, or raises :class:`zonos.errors.ZonosInputError`. Any other exception, a case running past its time limit
(a hang or unbounded work) or a silent all-zero result fails the test.

The cases mix well-formed arguments with wrong shapes and dtypes, NaN/inf, extreme values, bools and strings
where numbers are meant, and damaged files. Each test draws from its own seeded generator, so a failure
reproduces; the failing case's arguments are in the assertion message. Budget: about a minute on 2 CPU cores.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.tiny import save_tiny_checkpoint, tiny_codec, tiny_config
from zonos.codec.autoencoder import DACAutoencoder
from zonos.conditioning import make_cond_dict
from zonos.config import ZonosConfig
from zonos.errors import ZonosInputError
from zonos.sampling import SamplingParams
from zonos.speaker import SpeakerEmbedding, SpeakerNetConfig

CASE_SECONDS = 10.0  # a case past this is a hang or unbounded work; the slowest legitimate case takes ~0.3 s
NAN, INF = float("nan"), float("inf")


class CaseTimeout(Exception):
    """A fuzz case ran past CASE_SECONDS."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(
    label: str, fn: Callable[..., Any], *args: Any, seconds: float = CASE_SECONDS, **kwargs: Any
) -> tuple[bool, Any]:
    """``(True, fn(*args, **kwargs))``, or ``(False, error)`` for a ZonosInputError; anything else (including
    running past ``seconds``) fails with ``label``."""
    try:
        with time_limit(seconds), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the int16-scale warning is expected for some cases
            return True, fn(*args, **kwargs)
    except ZonosInputError as e:
        assert str(e), f"{label}: ZonosInputError without a message"
        return False, e
    except Exception as e:  # noqa: BLE001 - the point of the suite
        raise AssertionError(f"{label}: {type(e).__name__}: {e}") from e


def short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}:{value.dtype}"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape}:{value.dtype}"
    text = repr(value)
    return text if len(text) < 50 else text[:47] + "..."


def describe(**kwargs: Any) -> str:
    return ", ".join(f"{k}={short(v)}" for k, v in kwargs.items())


def pick(rng: random.Random, options: list[Callable[[], Any]] | list[Any]) -> Any:
    choice = rng.choice(options)
    return choice() if callable(choice) and not isinstance(choice, type) else choice


def seeded_tensor(rng: random.Random, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(shape, generator=torch.Generator().manual_seed(rng.randrange(2**31)))


def sprinkle(t: torch.Tensor, value: float, rng: random.Random) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[rng.randrange(t.numel())] = value
    return t


BAD_NUMBERS = [NAN, INF, -INF, True, False, "2", None, [1.0], b"1", 1j, object()]
ODD_NUMBERS = [0, -1, 0.5, 1e30, -1e30, 3e38, 1e-45, 2**70, np.float32(2.5), np.int64(3), torch.tensor(1.5)]


# -- fixtures: tiny model, codec and speaker network -------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("fuzz_ckpt"), "hybrid")


@pytest.fixture(scope="module")
def model(checkpoint):
    from zonos.model import Zonos

    m = Zonos.from_local(*checkpoint, device="cpu", autoencoder=tiny_codec(), max_seqlen=160)
    torch.manual_seed(0)
    config = SpeakerNetConfig(in_planes=4, num_blocks=(1, 1, 1, 1), attention_dim=8, embed_dim=16, lda_dim=128)
    spk = SpeakerEmbedding(
        __import__("zonos.speaker.network", fromlist=["ResNetSimAMASP"]).ResNetSimAMASP(config),
        torch.nn.Linear(16, 128),
    )
    m.spk_clone_model = spk.eval()  # what make_speaker_embedding would download on first use
    for language in ("en-us", "de", "fr-fr"):  # one-time costs (eSpeak voices, importing inflect) are no case's
        make_cond_dict(text="It is 3 pm.", language=language, device="cpu")
    return m


# -- make_cond_dict and prepare_conditioning ---------------------------------------------------------------------

TEXTS = [
    "Hello world.",
    "It is 3:15 on the 21st, and $2.50 is due.",
    "",
    "   ",
    "\u200b",
    "<>",
    "_",
    "\x00",
    "\ud800 lone",
    "1" * 40,
    "1,2,3,4,5,6,7,8,9,10,11,12",
    "Ünïcödé façade",
    "😀😀",
    "...!?",
    "word " * 30,
    5,
    None,
    b"bytes",
    ["Hello"],
]
LANGUAGES = ["en-us", "EN-US", "de", "fr-fr", "ja", "xx", "", None, 5, "en"]


def _speaker(rng: random.Random) -> Any:
    return pick(
        rng,
        [
            None,
            lambda: seeded_tensor(rng, (128,)),
            lambda: seeded_tensor(rng, (1, 1, 128)).to(torch.bfloat16),
            lambda: sprinkle(seeded_tensor(rng, (128,)), pick(rng, [NAN, INF, -INF]), rng),
            lambda: seeded_tensor(rng, (127,)),
            lambda: seeded_tensor(rng, (128,), scale=1e30),
            lambda: torch.ones(128, dtype=torch.long),
            lambda: torch.ones(128, dtype=torch.bool),
            lambda: [0.1] * 128,
            lambda: [0.1] * 127 + ["x"],
            "speaker",
        ],
    )


def _emotion(rng: random.Random) -> Any:
    return pick(
        rng,
        [
            [0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.5],
            [0.0] * 8,
            [-1.0] + [1.0] * 7,
            [3e38] * 8,
            [1e39] * 8,
            [NAN] * 8,
            [1.0] * 7,
            lambda: torch.rand(8),
            lambda: torch.rand(1, 1, 8, dtype=torch.float64),
            ["a"] * 8,
            [True] * 8,
            1.0,
        ],
    )


def _number(rng: random.Random, typical: float) -> Any:
    return pick(rng, [typical, typical, *ODD_NUMBERS, *BAD_NUMBERS])


def _cond_kwargs(rng: random.Random) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"device": "cpu"}
    if rng.random() < 0.4:  # well-formed arguments, varied
        kwargs.update(text=rng.choice(TEXTS[:2]), language=rng.choice(LANGUAGES[:4]))
        kwargs.update(speaker=pick(rng, [None, lambda: seeded_tensor(rng, (128,)), lambda: [0.1] * 128]))
        kwargs.update(emotion=pick(rng, [[0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.5], lambda: torch.rand(8), [3e38] * 8]))
        kwargs.update(fmax=rng.uniform(0, 24000), pitch_std=rng.uniform(0, 400), speaking_rate=rng.uniform(0, 40))
        return kwargs
    if rng.random() < 0.8:
        kwargs["text"] = rng.choice(TEXTS[:2]) if rng.random() < 0.5 else rng.choice(TEXTS)
    if rng.random() < 0.4:
        kwargs["language"] = rng.choice(LANGUAGES[:4]) if rng.random() < 0.5 else rng.choice(LANGUAGES)
    if rng.random() < 0.5:
        kwargs["speaker"] = _speaker(rng)
    if rng.random() < 0.4:
        kwargs["emotion"] = _emotion(rng)
    for key, typical in (("fmax", 22050.0), ("pitch_std", 45.0), ("speaking_rate", 15.0), ("ctc_loss", 0.0)):
        if rng.random() < 0.2:
            kwargs[key] = _number(rng, typical)
    if rng.random() < 0.15:
        kwargs["speaker_noised"] = pick(rng, [True, False, 1, 2, "yes", None])
    if rng.random() < 0.15:
        kwargs["unconditional_keys"] = pick(rng, [(), "emotion", ["speaker", "fmax"], ["espeak"], ["nope"], 5])
    if rng.random() < 0.1:
        kwargs["device"] = pick(rng, ["cpu", "cuda:7", "mps", "tpu", 3.5])
    return kwargs


def _check_cond(cond: dict[str, Any], label: str) -> None:
    for key, value in cond.items():
        if isinstance(value, torch.Tensor):
            assert bool(value.isfinite().all()), f"{label}: {key} is not finite"
    if "emotion" in cond:
        assert math.isclose(float(cond["emotion"].sum()), 1.0, rel_tol=1e-5), f"{label}: emotion does not sum to 1"


def test_fuzz_make_cond_dict_and_prepare_conditioning(model):
    rng = random.Random(1)
    refused = accepted = 0
    for i in range(150):
        kwargs = _cond_kwargs(rng)
        label = f"case {i}: make_cond_dict({describe(**kwargs)})"
        ok, cond = run_case(label, make_cond_dict, **kwargs)
        if not ok:
            refused += 1
            continue
        _check_cond(cond, label)
        ok, prefix = run_case(label + " -> prepare_conditioning", model.prepare_conditioning, cond)
        if ok:
            accepted += 1
            assert prefix.ndim == 3 and prefix.shape[0] == 2 and prefix.shape[-1] == 64, label
            assert bool(prefix.isfinite().all()) and prefix.abs().sum() > 0, label
    assert refused > 20 and accepted > 20  # both outcomes were exercised


def test_fuzz_hand_built_cond_dicts(model):
    """prepare_conditioning on dicts not made by make_cond_dict: wrong shapes, dtypes and values per key."""
    rng = random.Random(2)
    base = make_cond_dict(text="Hello there.", device="cpu")
    values = {
        "espeak": [(["Hi"], ["en-us"]), (["\u200b"], ["en-us"]), "Hi", (["Hi"], ["xx"]), ([], []), (["a", "b"], ["de"]),
                   torch.tensor([[2, 40, 3]]), torch.tensor([[2, 999, 3]]), torch.tensor([[2.0, 3.0]]), 5],
        "speaker": [None, torch.randn(1, 1, 128), torch.full((1, 1, 128), NAN), torch.randn(3, 1, 128),
                    torch.randn(1, 1, 64), "x"],
        "emotion": [torch.rand(1, 1, 8), torch.full((1, 1, 8), INF), torch.rand(1, 1, 9), torch.ones(1, 1, 8).bool()],
        "pitch_std": [torch.tensor([[[45.0]]]), torch.tensor([[[NAN]]]), 45.0, [45.0], "45", torch.tensor(1e38)],
        "language_id": [torch.tensor([[[24]]]), torch.tensor([[[500]]]), torch.tensor([[[-5]]]),
                        torch.tensor([[[0.5]]]), torch.tensor([[[NAN]]])],
    }  # fmt: skip
    for i in range(60):
        cond = dict(base)
        for key in rng.sample(sorted(values), rng.randint(1, 2)):
            cond[key] = rng.choice(values[key])
        label = f"case {i}: prepare_conditioning({describe(**{k: cond[k] for k in values})})"
        ok, prefix = run_case(label, model.prepare_conditioning, cond)
        if ok:
            assert prefix.ndim == 3 and bool(prefix.isfinite().all()), label


# -- generate ----------------------------------------------------------------------------------------------------


def test_fuzz_sampling_params():
    rng = random.Random(3)
    for i in range(200):
        params = {}
        for name in rng.sample(["temperature", "top_p", "top_k", "min_p", "linear", "conf", "quad",
                                "repetition_penalty", "repetition_penalty_window"], rng.randint(1, 3)):  # fmt: skip
            params[name] = pick(rng, [0, 1, 2, 0.5, 50, *ODD_NUMBERS, *BAD_NUMBERS])
        ok, p = run_case(f"case {i}: SamplingParams.from_dict({params})", SamplingParams.from_dict, params)
        if ok:
            assert all(isinstance(getattr(p, f), (int, float)) and math.isfinite(getattr(p, f)) for f in params)


def _fuzz_generate(
    model: Any, good_prefix: torch.Tensor, rng: random.Random, cases: int, seconds: float = CASE_SECONDS
) -> int:
    """``cases`` random generate calls on ``model`` from ``good_prefix`` and damaged copies of it, each within
    ``seconds``; returns how many generated."""
    device = model.device

    def codes(high: int, shape: tuple[int, ...], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.randint(0, high, shape).to(dtype).to(device)

    good = {
        "audio_prefix_codes": [None, lambda: codes(1024, (1, 9, 3)), lambda: codes(256, (1, 9, 3), torch.uint8),
                               lambda: codes(1024, (1, 9, 3), torch.int16)],
        "max_new_tokens": [1, 3, 5, np.int64(4)],
        "cfg_scale": [2.0, 1.0, 1, 0.0, 5.0, np.float32(1.5)],
        "batch_size": [1, 1, 2],
        "sampling_params": [None, {}, {"min_p": 0.1}, {"temperature": 0}, {"top_k": 5, "top_p": 0.9},
                            {"linear": 0.5, "conf": 0.4, "quad": 0.1}, {"temperature": 1e-30},
                            {"repetition_penalty": 1e-30, "repetition_penalty_window": 4},
                            {"linear": 0.5, "conf": -0.5}, {"linear": 0.5, "quad": -2.0}, {"temperature": 1e6}],
        "generator": [None, lambda: torch.Generator(device).manual_seed(rng.randrange(100)),
                      lambda: torch.Generator().manual_seed(rng.randrange(100))],  # a CPU one serves any device
    }  # fmt: skip
    other = "cpu" if device.type == "cuda" else "meta"
    bad = {
        "prefix_conditioning": [lambda: sprinkle(good_prefix, NAN, rng), lambda: sprinkle(good_prefix, INF, rng),
                                good_prefix[:, :0], good_prefix[..., :32], good_prefix.long(), good_prefix[0],
                                good_prefix.repeat(3, 1, 1), lambda: good_prefix.to(other), "prefix"],
        "audio_prefix_codes": [lambda: torch.full((1, 9, 2), 1024), lambda: torch.full((1, 9, 2), -1),
                               lambda: torch.rand(1, 9, 2), lambda: torch.zeros(1, 8, 2, dtype=torch.long),
                               lambda: torch.zeros(3, 9, 2, dtype=torch.long), [[0, 1]] * 9],
        "max_new_tokens": [0, -1, True, 2.0, "4", None],
        "cfg_scale": [1e30, 1e300, NAN, INF, "2", None, True],
        "batch_size": [0, True, 2.5, "1"],
        "sampling_params": [{"temperature": NAN}, {"temperature": INF}, {"repetition_penalty": NAN},
                            {"conf": NAN, "linear": 0.5}, {"top_k": NAN}, {"top_k": 2.5},
                            {"repetition_penalty_window": 2.5}, {"repetition_penalty_window": True},
                            {"min_p": "0.1"}, {"nucleus": 0.9}, "min_p=0.1", {"temperature": 1e39},
                            {"linear": 3e38}, {"top_k": 2**63}],
        "generator": [5, lambda: np.random.default_rng(0)],
    }  # fmt: skip
    generated = 0
    for i in range(cases):
        kwargs = {key: pick(rng, options) for key, options in good.items()}
        kwargs["prefix_conditioning"] = good_prefix
        for key in rng.sample(sorted(bad), rng.choice([0, 0, 1, 1, 2])):
            kwargs[key] = pick(rng, bad[key])
        label = f"case {i}: generate({describe(**kwargs)}) on {device}"
        ok, out = run_case(label, model.generate, **kwargs, progress_bar=False, seconds=seconds)
        if not ok:
            continue
        generated += 1
        frames = kwargs["max_new_tokens"] + (0 if kwargs["audio_prefix_codes"] is None else 3)
        assert out.dtype == torch.long and out.ndim == 3 and out.shape[1] == 9, label
        assert out.shape[0] == int(kwargs["batch_size"]) and out.shape[2] <= frames, label
        assert out.numel() == 0 or (0 <= int(out.min()) and int(out.max()) < 1024), label
        if out.shape[-1] >= 2:
            assert bool(out.any()), f"{label}: silent all-zero codes"
    return generated


def _hello(model: Any) -> torch.Tensor:
    return model.prepare_conditioning(make_cond_dict(text="Hello there.", device=model.device))


def test_fuzz_generate(model):
    assert _fuzz_generate(model, _hello(model), random.Random(4), 40) >= 8


@pytest.mark.gpu
def test_fuzz_generate_on_cuda(checkpoint):
    """The same cases on a CUDA model with every accelerator that runs here (Triton ops, fused sampling, CUDA
    graphs): inputs on the wrong device, a CPU generator, NaN in a GPU prefix are refused as on the CPU."""
    from zonos.model import Zonos

    m = Zonos.from_local(*checkpoint, device="cuda", dtype=torch.float32, autoencoder=tiny_codec("cuda"),
                         max_seqlen=160)  # fmt: skip
    m.use_accelerators(fast_ops=True, cuda_graphs=True, fused_sampling=True)
    # A random prefix (2 rows: conditional, unconditional) stands in for the conditioning, which needs eSpeak.
    prefix = torch.randn(2, 24, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    # A case may pay for compiling a kernel or capturing a graph of a new batch size: minutes on a fresh machine.
    assert _fuzz_generate(m, prefix, random.Random(16), 40, seconds=240) >= 8
    assert _fuzz_generate_streams(m, prefix, random.Random(17), 20, seconds=240) >= 3


# -- speaker embedding ---------------------------------------------------------------------------------------


def _clip(rng: random.Random) -> Any:
    seconds = pick(rng, [1.0, 1.0, 0.6, 0.4, 0.0, 2.5])
    sr_hint = 16000
    n = int(seconds * sr_hint)
    wav = seeded_tensor(rng, (n,), 0.2)
    return pick(
        rng,
        [
            lambda: wav,
            lambda: wav[None].repeat(2, 1),
            lambda: wav[:, None].repeat(1, 2),  # [samples, channels]
            lambda: wav[None, None],
            lambda: wav.double(),
            lambda: wav.half(),
            lambda: wav.bfloat16(),
            lambda: (wav * 32767).to(torch.int16),
            lambda: wav * 32767,
            lambda: wav * 1e30,
            lambda: wav * 1e-9,
            lambda: torch.zeros(n),
            lambda: sprinkle(wav, NAN, rng) if n else wav,
            lambda: sprinkle(wav, INF, rng) if n else wav,
            lambda: wav.numpy(),
            lambda: torch.complex(wav, wav),
            lambda: wav > 0,
            lambda: wav.tolist()[:100],
            lambda: torch.tensor(0.5),
        ],
    )


SAMPLE_RATES = [16000, 16000, 8000, 22050, 44100, 48000, 44101, 12345, 1, 7999, 0, -16000, True, 16000.0,
                16000.5, "16000", None, NAN, np.int32(22050), 10**6, 768000, 768001]  # fmt: skip


def test_fuzz_make_speaker_embedding(model):
    rng = random.Random(5)
    embedded = 0
    for i in range(70):
        wav, sr = _clip(rng), rng.choice(SAMPLE_RATES)
        label = f"case {i}: make_speaker_embedding({describe(wav=wav, sr=sr)})"
        ok, emb = run_case(label, model.make_speaker_embedding, wav, sr)
        if ok:
            embedded += 1
            assert emb.shape == (1, 1, 128) and bool(emb.isfinite().all()) and bool(emb.any()), label
    assert embedded >= 5


# -- codec ------------------------------------------------------------------------------------------------------


def test_fuzz_autoencoder(model):
    codec = model.autoencoder
    rng = random.Random(6)
    for i in range(60):
        wav, sr = _clip(rng), rng.choice(SAMPLE_RATES)
        if isinstance(wav, torch.Tensor) and rng.random() < 0.5:
            wav = wav.reshape(1, 1, -1) if wav.dim() < 3 else wav
        label = f"case {i}: preprocess({describe(wav=wav, sr=sr)})"
        ok, pre = run_case(label, codec.preprocess, wav, sr)
        if not ok:
            continue
        assert bool(pre.isfinite().all()) and pre.shape[-1] % 512 == 0, label
        ok, codes = run_case(label + " -> encode", codec.encode, pre)
        if ok:
            assert codes.dtype == torch.long and codes.shape[1] == 9, label
            assert 0 <= int(codes.min()) and int(codes.max()) < 1024, label
            ok, audio = run_case(label + " -> decode", codec.decode, codes)
            assert ok, label
            assert bool(audio.isfinite().all()) and float(audio.abs().max()) <= 1.0 and bool(audio.any()), label
    for i in range(40):
        codes = pick(
            rng,
            [
                lambda: torch.randint(0, 1024, (1, 9, rng.randint(0, 6))),
                lambda: torch.randint(0, 256, (2, 9, 3)).to(torch.uint8),
                lambda: torch.randint(0, 1024, (1, 9, 3)).to(torch.int16),
                lambda: torch.full((1, 9, 2), 1024),
                lambda: torch.full((1, 9, 2), -3),
                lambda: torch.rand(1, 9, 2),
                lambda: torch.ones(1, 9, 2, dtype=torch.bool),
                lambda: torch.zeros(9, 2, dtype=torch.long),
                lambda: torch.zeros(1, 8, 2, dtype=torch.long),
                [[0, 1]] * 9,
            ],
        )
        label = f"case {i}: decode({describe(codes=codes)})"
        ok, audio = run_case(label, codec.decode, codes)
        if ok:
            assert audio.shape == (codes.shape[0], 1, 512 * codes.shape[2]), label
            if audio.numel():
                assert bool(audio.isfinite().all()) and float(audio.abs().max()) <= 1.0, label
                assert bool(audio.any()), f"{label}: silent audio"


# -- files: config parsing and from_local -------------------------------------------------------------------------


def _mutate_config(cfg: dict, rng: random.Random) -> str:
    """One random change to a config dict (in place); returns what it did."""
    backbone = cfg.get("backbone") if isinstance(cfg.get("backbone"), dict) else {}
    sections = [cfg, backbone] + [backbone[k] for k in ("attn_cfg", "ssm_cfg") if isinstance(backbone.get(k), dict)]
    section = rng.choice(sections)
    if not section or rng.random() < 0.2:
        section[rng.choice(["extra", "d_model", "eos_token_id", "layer", "causal"])] = pick(rng, [1, "1", None])
        return "added a key"
    key = rng.choice(sorted(section))
    action = rng.choice(["delete", "type", "value"])
    if action == "delete":
        del section[key]
    elif action == "type":
        section[key] = pick(rng, ["1024", True, None, [1], {"a": 1}, 1.5, NAN])
    else:
        value = section[key]
        if isinstance(value, bool):
            section[key] = not value
        elif isinstance(value, (int, float)):
            section[key] = pick(rng, [0, -1, value + 1, value * 2, 1e-30])
    return f"{action} {key!r}"


def test_fuzz_config_parsing():
    rng = random.Random(7)
    for i in range(200):
        cfg = tiny_config(rng.choice(["hybrid", "transformer"]))
        changes = [_mutate_config(cfg, rng) for _ in range(rng.randint(1, 2))]
        ok, config = run_case(f"case {i}: {changes}", ZonosConfig.from_dict, json.loads(json.dumps(cfg)))
        if ok:
            assert isinstance(config.eos_token_id, int) and config.backbone.norm_epsilon > 0


def test_fuzz_from_local_configs(checkpoint, tmp_path):
    from zonos.model import Zonos

    config_path, weights_path = checkpoint
    rng = random.Random(8)
    for i in range(12):
        cfg = json.loads(config_path.read_text())
        change = _mutate_config(cfg, rng)
        path = tmp_path / f"config{i}.json"
        text = json.dumps(cfg)
        if rng.random() < 0.25:
            text = text[: rng.randrange(len(text))]  # a truncated download
            change += ", truncated"
        path.write_text(text)
        label = f"case {i}: from_local with config: {change}"
        ok, m = run_case(label, Zonos.from_local, path, weights_path, device="cpu", autoencoder=tiny_codec())
        if not ok:
            assert str(path) in str(m), f"{label}: the error does not name the file: {m}"


def test_fuzz_from_local_damaged_weights(checkpoint, tmp_path):
    from zonos.model import Zonos

    config_path, weights_path = checkpoint
    data = weights_path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    rng = random.Random(9)
    for i in range(10):
        damaged = bytearray(data)
        kind = rng.choice(["truncate", "header byte", "data bytes", "nan"])
        if kind == "truncate":
            damaged = damaged[: rng.randrange(len(damaged))]
        elif kind == "header byte":
            damaged[rng.randrange(header)] = rng.randrange(256)
        elif kind == "data bytes":
            for _ in range(8):
                damaged[rng.randrange(header, len(damaged))] = rng.randrange(256)
        else:  # a bf16 NaN (0x7fc0) in the weights
            at = header + 2 * rng.randrange((len(damaged) - header) // 2)
            damaged[at : at + 2] = b"\xc0\x7f"
        path = tmp_path / f"model{i}.safetensors"
        path.write_bytes(bytes(damaged))
        label = f"case {i}: from_local with weights damaged by {kind}"
        ok, m = run_case(label, Zonos.from_local, config_path, path, device="cpu", autoencoder=tiny_codec())
        if ok:
            assert all(bool(p.isfinite().all()) for p in m.parameters()), f"{label}: non-finite weights loaded"
        else:
            assert str(path) in str(m) or "model.safetensors" in str(m), f"{label}: the file is not named: {m}"


def test_fuzz_codec_from_local(tmp_path):
    codec = tiny_codec()
    codec.save_pretrained(tmp_path / "good")
    rng = random.Random(10)
    for i in range(10):
        directory = tmp_path / f"dac{i}"
        directory.mkdir()
        cfg = json.loads((tmp_path / "good" / "config.json").read_text())
        key = rng.choice(sorted(cfg))
        cfg[key] = pick(rng, ["64", None, True, -1, 0, [2, "4"], 1.5])
        (directory / "config.json").write_text(json.dumps(cfg))
        weights = (tmp_path / "good" / "model.safetensors").read_bytes()
        (directory / "model.safetensors").write_bytes(weights[: rng.randrange(len(weights))] if i % 2 else weights)
        label = f"case {i}: DACAutoencoder.from_local with {key}={cfg[key]!r}, truncated={bool(i % 2)}"
        run_case(label, DACAutoencoder.from_local, directory)


# -- text: the number normalizer, the phonemizer and the segmenter -------------------------------------------------

TEXT_PARTS = ["1", "12", "1,234", "0", "007", "3.14", "$", "£", "%", "1st", "22nd", "3rd", "th", ".", ",", " ", "-",
              "a", "Word", "e5", "1e10", "½", "٣", "９", "\u200b", "\x00", "\ud800", "😀", "日本", "é", "<", ">", "_",
              "\n", "\t", "...", "?!"]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(1, 12)):
        pieces.append(rng.choice(TEXT_PARTS))
        if rng.random() < 0.3:  # a digit run, up to well past what inflect spells (36 digits)
            pieces.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60))))
    return "".join(pieces)


def test_fuzz_number_normalizer():
    """normalize_numbers never raises and leaves no ASCII digit for the phonemizer to read on its own."""
    from zonos.conditioning.text_normalization import normalize_numbers

    rng = random.Random(11)
    for i in range(400):
        text = _random_text(rng)
        with time_limit(CASE_SECONDS):
            out = normalize_numbers(text)
        assert isinstance(out, str) and not any(c in "0123456789" for c in out), f"case {i}: {text!r} -> {out!r}"


def test_fuzz_random_text_through_conditioning(model):
    """Random text (numbers, symbols, control characters, lone surrogates, other scripts) is conditioned or
    refused as input; a refusal says why. (Long digit runs are read out word by word, so many prefixes are past the
    tiny model's 160 positions: a refusal too.)"""
    rng = random.Random(12)
    made = conditioned = 0
    for i in range(60):
        text = _random_text(rng)
        language = rng.choice(["en-us", "en-us", "de", "fr-fr"])
        label = f"case {i}: make_cond_dict(text={text!r}, language={language!r})"
        ok, cond = run_case(label, make_cond_dict, text=text, language=language, device="cpu")
        if ok:
            made += 1
            _check_cond(cond, label)
            ok, prefix = run_case(label + " -> prepare_conditioning", model.prepare_conditioning, cond)
            conditioned += ok
            if ok:
                assert bool(prefix.isfinite().all()), label
    assert made >= 30 and conditioned >= 5


def test_fuzz_split_text():
    from zonos.conditioning.segments import split_text, text_cost

    rng = random.Random(13)
    for i in range(200):
        text = pick(rng, [lambda: _random_text(rng) * rng.randint(1, 30), "", "   ", None, 5, b"text"])
        budget = pick(rng, [300, 40, 1, 7, 0, -5, 2.5, True, "300", None])
        label = f"case {i}: split_text({short(text)}, {budget!r})"
        ok, segments = run_case(label, split_text, text, budget)
        if ok:
            assert segments and all(isinstance(s, str) and s == s.strip() and s for s in segments), label
            assert "".join("".join(s.split()) for s in segments) == "".join(text.split()), label
            for s in segments:  # over the budget only as one word that is longer than it
                assert text_cost(s) <= budget or len(s.split()) == 1, f"{label}: {s!r}"


# -- streaming, the engine's handles and long-form speech ---------------------------------------------------------


def _settles(engine: Any, seconds: float = 5.0) -> bool:
    """Whether the engine holds no request within ``seconds`` (a cancelled one frees its slot at the next step)."""
    deadline = time.monotonic() + seconds
    while engine.busy:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _fuzz_generate_streams(
    model: Any, prefix: torch.Tensor, rng: random.Random, cases: int, seconds: float = CASE_SECONDS
) -> int:
    """``cases`` random streams and handles on ``model`` from ``prefix``, each within ``seconds``; returns how
    many streamed."""
    good = dict(max_new_tokens=[4, 6, np.int64(5)], first_chunk_frames=[1, 2, 4, 16, np.int64(3)],
                chunk_frames=[1, 2, 4, 16], cfg_scale=[2.0, 1.0, 3.5])  # fmt: skip
    bad = dict(max_new_tokens=[0, "6", None], first_chunk_frames=[0, -1, True, 2.5, "4", None],
               chunk_frames=[0, -1, True, 2.5, "4", None], cfg_scale=[NAN, INF, None])  # fmt: skip
    streamed = 0
    for i in range(cases):
        kwargs = {k: pick(rng, bad[k] if rng.random() < 0.15 else good[k]) for k in good}
        kwargs.update(generator=torch.Generator(model.device).manual_seed(i), progress_bar=False)
        via = rng.choice(["generate", "submit", "submit-result"])
        abandon = rng.random() < 0.3
        label = f"case {i}: {via}({describe(**kwargs)}), abandon={abandon}"

        def run(via: str, kwargs: dict, abandon: bool) -> list:
            if via == "submit-result":
                return [model.submit(prefix, **kwargs).result()]
            chunks = (
                model.generate(prefix, stream=True, **kwargs)
                if via == "generate"
                else model.submit(prefix, stream=True, **kwargs)
            )
            out = []
            for chunk in chunks:
                out.append(chunk)
                if abandon:
                    (chunks.close if via == "generate" else chunks.cancel)()
                    break
            return out

        ok, out = run_case(label, run, via, kwargs, abandon, seconds=seconds)
        if ok and via == "submit-result":
            codes = out[0]
            assert codes.shape[:2] == (1, 9) and 0 <= int(codes.min()) and int(codes.max()) < 1024, label
        elif ok:
            streamed += 1
            assert out, f"{label}: no chunk"
            frame = sample = 0
            for chunk in out:  # frames and samples each tile the utterance (the audio lags the codes)
                assert chunk.frames[0] == frame and chunk.codes.shape[-1] == chunk.frames[1] - frame, label
                assert chunk.samples[0] == sample and chunk.audio.shape[-1] == chunk.samples[1] - sample, label
                assert bool(chunk.audio.isfinite().all()), label
                frame, sample = chunk.frames[1], chunk.samples[1]
            assert abandon or (out[-1].final and sample == 512 * frame), label
        assert _settles(model.engine), f"{label}: the engine still holds work"
    return streamed


def test_fuzz_streams_and_handles(model):
    """generate(stream=True) and submit with good and bad schedules and arguments; some streams are abandoned
    after their first chunk. A stream's chunks tile its frames and samples (all of them by its final chunk), and
    each request after a bad or abandoned one still runs (the engine is left ready)."""
    assert _fuzz_generate_streams(model, _hello(model), random.Random(14), 30) >= 5


def test_fuzz_speak_segments(model):
    from zonos.longform import speak_segments

    rng = random.Random(15)
    spoken = 0
    for i in range(20):
        good = rng.random() < 0.6
        segments = pick(rng, [["Hello there.", "How are you?"], ["One."], ("Hi.", "Yes.", "No.")] if good else
                        [[], ["Hi.", ""], ["\u200b"], [5], "Hello there.", "Hi", None])  # fmt: skip
        cond = pick(rng, [None, {}, {"language": "de"}, {"emotion": [1.0] * 8}] if rng.random() < 0.7 else
                    [{"language": "xx"}, {"text": "no"}, {"speaker": torch.full((128,), NAN)}, "en-us",
                     {"mood": 1}])  # fmt: skip
        stream = rng.random() < 0.5
        kwargs = dict(max_new_tokens=pick(rng, [4, 4, 4, 0]), progress_bar=False,
                      generator=torch.Generator().manual_seed(i))  # fmt: skip
        label = f"case {i}: speak_segments({describe(segments=segments, cond=cond)}, stream={stream})"

        def run(segments: Any, cond: Any, stream: bool, kwargs: dict) -> Any:
            out = speak_segments(model, segments, cond=cond, stream=stream, **kwargs)
            return list(out) if stream else out

        ok, out = run_case(label, run, segments, cond, stream, kwargs)
        if ok:
            spoken += 1
            if stream:
                assert out and out[-1].final and all(bool(c.audio.isfinite().all()) for c in out), label
                codes = torch.cat([c.codes for c in out], -1)
            else:
                codes = out
            assert codes.shape[:2] == (1, 9) and codes.shape[-1] > 0 and bool(codes.any()), label
        assert _settles(model.engine), label
    assert spoken >= 4
