"""zonos.validation's checks, check_generate_args, and the loaders' errors for bad config and checkpoint files."""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.tiny import real_config
from zonos.checkpoint import CheckpointMismatchError, check_state_dict, load_safetensors
from zonos.config import ZonosConfig
from zonos.errors import CheckpointError, ZonosInputError
from zonos.hub import resolve_file
from zonos.validation import (
    check_device,
    check_finite,
    check_generate_args,
    check_generator,
    check_int,
    check_real,
    same_device,
)

D = 8


# -- the small checks ------------------------------------------------------------------------------------------


def test_check_real_accepts_numbers_and_refuses_the_rest():
    assert check_real("x", 2) == 2.0 and isinstance(check_real("x", np.float32(0.5)), float)
    assert check_real("x", torch.tensor(1.5)) == 1.5
    for bad in (True, "2", None, float("nan"), float("inf"), -float("inf"), [1.0], 1j):
        with pytest.raises(ZonosInputError, match="x must be"):
            check_real("x", bad)
    with pytest.raises(ZonosInputError, match=r"\(0, 1\]"):
        check_real("x", 0.0, 0.0, 1.0, lo_open=True)
    assert check_real("x", 1.0, 0.0, 1.0, lo_open=True) == 1.0
    with pytest.raises(ZonosInputError, match=r"\[0, 1\]"):
        check_real("x", 1.5, 0.0, 1.0)


def test_check_int():
    assert check_int("n", np.int64(3)) == 3 and check_int("n", torch.tensor(4)) == 4
    assert check_int("n", 50.0, allow_integral_float=True) == 50
    for bad in (True, False, 2.5, 2.0, "3", None, float("nan")):
        with pytest.raises(ZonosInputError, match="n must be an integer"):
            check_int("n", bad)
    with pytest.raises(ZonosInputError, match=r"\[1, inf\]"):
        check_int("n", 0, 1)


def test_check_finite_counts_bad_values_and_passes_integers():
    x = torch.ones(10)
    assert check_finite("t", x, "fix it") is x
    check_finite("t", torch.zeros(3, dtype=torch.long), "fix it")
    x[3], x[7] = float("nan"), float("inf")
    with pytest.raises(ZonosInputError, match="t contains 2 NaN or infinite value.*fix it"):
        check_finite("t", x, "fix it")


def test_devices_and_generators():
    assert check_device("device", "cpu") == torch.device("cpu")
    for bad in ("gpu0", 3.5, True):
        with pytest.raises(ZonosInputError, match="device"):
            check_device("device", bad)
    if not torch.cuda.is_available():
        with pytest.raises(ZonosInputError, match="not available.*'cpu'"):
            check_device("device", "cuda")
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        with pytest.raises(ZonosInputError, match="'mps' is not available"):
            check_device("device", "mps")
    assert same_device("cpu", torch.device("cpu")) and not same_device("cpu", "cuda")
    check_generator(None, "cpu")
    check_generator(torch.Generator(), "cpu")
    check_generator(torch.Generator(), "cuda")  # the seeds are drawn on the generator's device: the CPU serves any
    if torch.cuda.is_available():
        with pytest.raises(ZonosInputError, match="generator is on cuda(:0)? but the model is on cpu"):
            check_generator(torch.Generator("cuda"), "cpu")
    with pytest.raises(ZonosInputError, match="torch.Generator"):
        check_generator(np.random.default_rng(0), "cpu")


# -- check_generate_args ---------------------------------------------------------------------------------------


def _args(**overrides):
    args = dict(
        prefix=torch.randn(2, 5, D),
        audio_prefix_codes=None,
        max_new_tokens=10,
        cfg_scale=2.0,
        batch_size=1,
        generator=None,
    )
    args.update(overrides)
    return args


def _check(**overrides):
    return check_generate_args(**_args(**overrides), device="cpu", d_model=D)


def test_generate_args_valid_and_normalised():
    assert _check() == (10, 2.0, 1)
    out = _check(
        max_new_tokens=np.int64(4), cfg_scale=np.float32(1.0), batch_size=np.int32(3), prefix=torch.randn(1, 5, D)
    )
    assert out == (4, 1.0, 3) and all(type(v) in (int, float) for v in out)
    _check(batch_size=2, prefix=torch.randn(4, 5, D))  # cond rows then uncond rows
    _check(cfg_scale=1.0, prefix=torch.randn(2, 5, D))  # a cond || uncond pair with guidance off
    _check(generator=torch.Generator().manual_seed(0))


def test_generate_args_of_a_prefix_with_grad_warn_nothing():
    prefix = torch.randn(2, 5, D, requires_grad=True) * 2  # a non-leaf, as prepare_conditioning builds it with grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "Converting a tensor with requires_grad=True to a scalar" fails it
        assert _check(prefix=prefix) == (10, 2.0, 1)
    with pytest.raises(ZonosInputError, match="NaN or infinite"):
        _check(prefix=torch.full((2, 5, D), float("inf"), requires_grad=True))


def test_guidance_off_takes_prepare_conditionings_rows_for_any_batch():
    for batch in (2, 3):
        _check(cfg_scale=1.0, batch_size=batch, prefix=torch.randn(2 * batch, 5, D))  # cond rows, then uncond
        _check(cfg_scale=1.0, batch_size=batch, prefix=torch.randn(batch, 5, D))  # the cond rows alone
    with pytest.raises(ZonosInputError, match=r"must be 2 .* or 6 .* the cond rows alone \(1 or 3\)"):
        _check(cfg_scale=1.0, batch_size=3, prefix=torch.randn(4, 5, D))


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        # what Zonos._validate checked
        ({"batch_size": 0}, "batch_size must be an integer in"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer in"),
        ({"max_new_tokens": 2.0}, "max_new_tokens must be an integer"),
        ({"prefix": torch.randn(2, 5, D + 1)}, r"\(batch, length, 8\)"),
        ({"prefix": torch.randn(5, D)}, r"\(batch, length, 8\)"),
        ({"prefix": "prefix"}, r"\(batch, length, 8\)"),
        ({"prefix": torch.randn(3, 5, D)}, "prefix_conditioning has batch 3"),
        ({"prefix": torch.randn(4, 5, D), "batch_size": 3}, "must be 2 .* or 6"),
        ({"audio_prefix_codes": torch.zeros(1, 8, 4, dtype=torch.long)}, "audio_prefix_codes must be"),
        ({"audio_prefix_codes": torch.zeros(2, 9, 4, dtype=torch.long)}, "audio_prefix_codes must be"),
        ({"audio_prefix_codes": torch.zeros(1, 9, 4)}, "integer tensor"),
        ({"audio_prefix_codes": torch.full((1, 9, 4), 1024)}, r"0\.\.1023, got values in 1024\.\.1024"),
        ({"audio_prefix_codes": torch.full((1, 9, 4), -1)}, "0..1023"),
        # the additions
        ({"prefix": torch.full((2, 5, D), float("nan"))}, "prefix_conditioning contains 80 NaN"),
        ({"prefix": torch.randn(2, 5, D).index_fill(1, torch.tensor([2]), float("inf"))}, "NaN or infinite"),
        ({"prefix": torch.zeros(2, 5, D, dtype=torch.long)}, "floating-point"),
        ({"prefix": torch.randn(2, 0, D)}, "length 0"),
        ({"cfg_scale": float("nan")}, "cfg_scale must be a finite number"),
        ({"cfg_scale": float("inf")}, "cfg_scale must be a finite number"),
        ({"cfg_scale": 1e300}, r"cfg_scale must lie in \[-10000, 10000\]"),
        ({"cfg_scale": 10**400}, "cfg_scale must be a finite number"),
        ({"prefix": torch.randn(2, 5, D) * 1e20}, "holds values up to .* its logits would overflow"),
        ({"batch_size": 10**8}, r"batch_size must be an integer in \[1, 65536\]"),
        ({"cfg_scale": "2"}, "cfg_scale must be a real number, got '2'"),
        ({"cfg_scale": None}, "cfg_scale must be a real number, got None"),
        ({"cfg_scale": True}, "cfg_scale must be a real number"),
        ({"batch_size": True}, "batch_size must be an integer, got the bool True"),
        ({"batch_size": 2.5}, "batch_size must be an integer"),
        ({"generator": 0}, "generator must be a torch.Generator"),
        ({"audio_prefix_codes": torch.ones(1, 9, 4, dtype=torch.bool)}, "integer tensor"),
        ({"audio_prefix_codes": [[0] * 4] * 9}, "audio_prefix_codes must be a tensor"),
    ],
)
def test_generate_args_refused(overrides, pattern):
    with pytest.raises(ZonosInputError, match=pattern):
        _check(**overrides)


def test_generate_args_device_checks():
    with pytest.raises(ZonosInputError, match="prefix_conditioning is on cpu but the model is on cuda"):
        check_generate_args(**_args(), device="cuda", d_model=D)
    check_generator(torch.Generator(), torch.device("cuda", 0))


@pytest.mark.parametrize(
    "dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
)
def test_audio_prefix_codes_of_any_integer_dtype(dtype):
    hi = min(1023, torch.iinfo(dtype).max)
    codes = torch.randint(0, hi + 1, (1, 9, 6), generator=torch.Generator().manual_seed(0)).to(dtype)
    codes[0, 0, 0] = hi  # the top of the range: a uint8 compared with 1024 in its own dtype wraps to 0 and fails
    _check(audio_prefix_codes=codes)
    if dtype != torch.uint8 and dtype != torch.int8:
        with pytest.raises(ZonosInputError, match="0..1023"):
            _check(audio_prefix_codes=codes.long().masked_fill(codes.long() == hi, 1024).to(dtype))


# -- config.json ---------------------------------------------------------------------------------------------


def _write_config(tmp_path: Path, mutate=None, text: str | None = None) -> Path:
    cfg = real_config("hybrid")
    if mutate:
        mutate(cfg)
    path = tmp_path / "config.json"
    path.write_text(text if text is not None else json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda c: c.update(unexpected_key=1), r"unknown key\(s\) \['unexpected_key'\]"),
        (lambda c: c["backbone"].update(extra=1), r"backbone has unknown key\(s\) \['extra'\]"),
        (lambda c: c.update(eos_token_id="1024"), "eos_token_id must be an integer, got '1024'"),
        (lambda c: c["backbone"].update(norm_epsilon="1e-5"), "norm_epsilon must be a real number, got '1e-5'"),
        (lambda c: c["backbone"].update(norm_epsilon=0), r"norm_epsilon must lie in \(0, 1\]"),
        (lambda c: c["backbone"].update(d_model=True), "d_model must be an integer, got the bool True"),
        (lambda c: c["backbone"]["attn_cfg"].update(num_heads="16"), "num_heads must be an integer"),
        (lambda c: c["backbone"].update(attn_layer_idx=[0, 99]), r"attn_layer_idx\[1\] must be an integer in"),
        (lambda c: c["backbone"]["ssm_cfg"].update(d_state=1.5), "ssm_cfg.d_state must be an integer"),
        (lambda c: c.pop("backbone"), "'backbone'"),
        (lambda c: c["prefix_conditioner"]["conditioners"][2].update(min_val="0"), "min_val must be a finite number"),
        (lambda c: c["prefix_conditioner"]["conditioners"][0].update(type="Nope"), "type 'Nope'"),
        (lambda c: c["backbone"].update(n_layer=10_000), r"n_layer must be an integer in \[1, 1024\]"),
        (lambda c: c["backbone"]["ssm_cfg"].update(chunk_size=10**9), r"chunk_size must be an integer in \[1, 65536\]"),
        (lambda c: c["backbone"]["attn_cfg"].update(rotary_emb_dim=10**9), "rotary_emb_dim must be an integer in"),
        (lambda c: c.update(eos_token_id=10**12), r"eos_token_id must be an integer in \[0, 1024\]"),
    ],
)
def test_bad_config_json_names_the_file(tmp_path, mutate, pattern):
    path = _write_config(tmp_path, mutate)
    with pytest.raises(CheckpointError, match=pattern) as info:
        ZonosConfig.from_json(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ['{"backbone": ', "", "\xff\xfe", "[1, 2]"])
def test_malformed_config_json_names_the_file(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(CheckpointError) as info:
        ZonosConfig.from_json(path)
    assert str(path) in str(info.value)


def test_published_configs_still_parse():
    for kind in ("hybrid", "transformer"):
        config = ZonosConfig.from_dict(real_config(kind))
        assert config.eos_token_id == 1024 and config.backbone.d_model == 2048


# -- checkpoint files -----------------------------------------------------------------------------------------


def _safetensors(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(64, 64), "b": torch.arange(10)}, str(path))
    return path


@pytest.mark.parametrize("damage", ["truncate_header", "truncate_data", "garbage", "empty"])
def test_corrupt_safetensors_names_the_file_and_says_download_again(tmp_path, damage):
    path = _safetensors(tmp_path)
    data = path.read_bytes()
    path.write_bytes(
        {
            "truncate_header": data[:20],
            "truncate_data": data[: len(data) // 2],
            "garbage": b"\x00\x01\x02" * 100,
            "empty": b"",
        }[damage]
    )
    with pytest.raises(CheckpointError, match="download it again") as info:
        load_safetensors(path)
    assert str(path) in str(info.value)


def test_load_safetensors_round_trip(tmp_path):
    state = load_safetensors(_safetensors(tmp_path))
    assert set(state) == {"a", "b"} and state["b"].tolist() == list(range(10))


def test_non_finite_weights_are_refused_at_load():
    expected = {"w": torch.zeros(3), "n": torch.zeros((), dtype=torch.long)}
    given = {"w": torch.tensor([1.0, float("nan"), 2.0]), "n": torch.zeros((), dtype=torch.long)}
    with pytest.raises(CheckpointMismatchError, match="weights.bin has NaN or infinite values in 1 tensor.*: w"):
        check_state_dict(expected, given, "weights.bin", "the model", "hint")
    check_state_dict(expected, {**given, "w": torch.ones(3)}, "weights.bin", "the model", "hint")


def test_relative_model_directory_is_checked_locally(tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError("the Hub was called for a local path")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="models/zonos does not exist") as info:
        resolve_file("models/zonos", "config.json")
    assert time.perf_counter() - start < 0.5
    assert isinstance(info.value, FileNotFoundError)  # still caught by `except FileNotFoundError`


# -- through Zonos.from_local ---------------------------------------------------------------------------------


def _nan_weight(state: dict[str, torch.Tensor]) -> None:
    name = next(k for k in sorted(state) if k.endswith("weight") and state[k].ndim == 2)
    state[name][0, 0] = float("nan")


def test_nan_weights_in_a_checkpoint_are_refused_at_load(tmp_path):
    from tests.tiny import save_tiny_checkpoint
    from zonos.model import Zonos

    paths = save_tiny_checkpoint(tmp_path, "transformer", mutate=_nan_weight)
    with pytest.raises(CheckpointError, match=re.escape(str(paths[1])) + " has NaN or infinite values in 1 tensor"):
        Zonos.from_local(*paths, device="cpu")


def test_truncated_model_safetensors_through_from_local(tmp_path):
    from tests.tiny import save_tiny_checkpoint
    from zonos.model import Zonos

    config, weights = save_tiny_checkpoint(tmp_path, "transformer")
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="download it again") as info:
        Zonos.from_local(config, weights, device="cpu")
    assert str(weights) in str(info.value)


def test_a_uint64_past_int64_is_out_of_range():
    codes = torch.cat([torch.tensor([2**64 - 1], dtype=torch.uint64), torch.zeros(17, dtype=torch.uint64)])
    codes = codes.reshape(1, 9, 2)
    with pytest.raises(ZonosInputError, match="0..1023"):
        _check(audio_prefix_codes=codes)


def test_load_arguments_are_checked_before_any_file_is_read(tmp_path):
    """from_local and from_pretrained refuse a device, dtype, max_seqlen or backbone they cannot honour before
    reading (or downloading) anything: the paths here do not exist."""
    from zonos.model import Zonos

    missing = tmp_path / "nothing"
    cases = [
        (dict(device="gpu"), "device 'gpu' is not a device name"),
        (dict(device="mps"), "'mps' is not available on this machine"),
        (dict(dtype="float16"), "dtype must be a floating torch dtype"),
        (dict(dtype=torch.int8), "dtype must be a floating torch dtype"),
        (dict(max_seqlen="100"), "max_seqlen must be"),
        (dict(max_seqlen=-1), "max_seqlen must be"),
        (dict(backbone="x"), "unknown backbone 'x'"),
    ]
    if not torch.cuda.is_available():
        cases.append((dict(device="cuda"), "'cuda' is not available on this machine"))
    for kwargs, pattern in cases:
        with pytest.raises(ZonosInputError, match=pattern):
            Zonos.from_local(missing / "config.json", missing / "model.safetensors", **kwargs)
        with pytest.raises(ZonosInputError, match=pattern):
            Zonos.from_pretrained(str(missing), **kwargs)
