"""End to end on tiny random checkpoints: save → from_local → make_cond_dict → prepare_conditioning →
generate → autoencoder.decode, plus the decode loop's EOS bookkeeping and bad-input errors."""

import warnings

import pytest
import torch

from tests.tiny import save_tiny_checkpoint as _save
from tests.tiny import tiny_codec
from zonos.conditioning import make_cond_dict
from zonos.model import Zonos


@pytest.fixture(scope="module")
def codec():
    return tiny_codec()


@pytest.fixture(scope="module", params=["hybrid", "transformer"])
def tiny(request, tmp_path_factory, codec):
    paths = _save(tmp_path_factory.mktemp(request.param), request.param)
    return Zonos.from_local(*paths, device="cpu", autoencoder=codec, max_seqlen=256)


def _prefix(model, text="Hello, world! It is 3:15.", language="en-us"):
    return model.prepare_conditioning(make_cond_dict(text=text, language=language, device="cpu"))


def test_generate_and_decode(tiny):
    prefix = _prefix(tiny)
    assert prefix.shape[0] == 2 and prefix.dtype == torch.float32
    codes = tiny.generate(prefix, max_new_tokens=24, progress_bar=False, generator=torch.Generator().manual_seed(0))
    assert codes.shape[:2] == (1, 9) and 0 < codes.shape[2] <= 24
    assert codes.dtype == torch.long and 0 <= int(codes.min()) and int(codes.max()) < 1024
    wav = tiny.autoencoder.decode(codes)
    assert wav.shape == (1, 1, 512 * codes.shape[2]) and torch.isfinite(wav).all() and wav.abs().sum() > 0


def test_seeded_generation_is_reproducible_and_state_is_reused(tiny):
    prefix = _prefix(tiny)
    a = tiny.generate(prefix, max_new_tokens=16, progress_bar=False, generator=torch.Generator().manual_seed(7))
    state = tiny.engine.slots.state
    b = tiny.generate(prefix, max_new_tokens=16, progress_bar=False, generator=torch.Generator().manual_seed(7))
    c = tiny.generate(prefix, max_new_tokens=16, progress_bar=False, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert tiny.engine.slots.state is state  # caches kept their addresses across requests


def test_batch_and_guidance_variants(tiny):
    prefix = _prefix(tiny)
    gen = torch.Generator().manual_seed(1)
    codes = tiny.generate(prefix, max_new_tokens=12, batch_size=3, progress_bar=False, generator=gen)
    assert codes.shape[0] == 3
    greedy = tiny.generate(
        prefix, max_new_tokens=12, cfg_scale=1.0, progress_bar=False, sampling_params={"temperature": 0}
    )
    again = tiny.generate(
        prefix, max_new_tokens=12, cfg_scale=1.0, progress_bar=False, sampling_params={"temperature": 0}
    )
    assert torch.equal(greedy, again)


def test_guidance_off_keeps_every_batch_row_conditional(tiny):
    # prepare_conditioning's (2, L, d) cond || uncond prefix with cfg_scale 1 and batch 2: both clips come from the
    # cond row (the speaker), as a solo run does; greedy sampling, so the two rows' different seeds do not matter.
    speaker = torch.randn(128, generator=torch.Generator().manual_seed(4))
    prefix = tiny.prepare_conditioning(make_cond_dict(text="Hello, world!", speaker=speaker, device="cpu"))
    kwargs = dict(max_new_tokens=12, cfg_scale=1.0, progress_bar=False, sampling_params={"temperature": 0})
    batch = tiny.generate(prefix, batch_size=2, **kwargs)
    solo = tiny.generate(prefix, **kwargs)
    uncond = tiny.generate(prefix[1:], **kwargs)
    assert not torch.equal(uncond[0], solo[0])  # the rows differ, so the check below can fail
    assert torch.equal(batch[0], solo[0]) and torch.equal(batch[1], solo[0])
    # Two cond rows, then two uncond rows: each sequence its own cond row, also with guidance off.
    pair = torch.cat([prefix[:1], prefix[1:], prefix[1:], prefix[:1]])
    rows = tiny.generate(pair, batch_size=2, **kwargs)
    assert torch.equal(rows[0], solo[0]) and torch.equal(rows[1], uncond[0])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_stream_stopped_at_once_yields_batch_shaped_chunks(tiny, batch_size):
    for callback in (lambda *a: False, lambda *a: None):
        chunks = list(
            tiny.generate(
                _prefix(tiny), stream=True, batch_size=batch_size, max_new_tokens=8, progress_bar=False,
                callback=callback,
            )
        )  # fmt: skip
        assert chunks and chunks[-1].final
        for chunk in chunks:
            assert chunk.audio.shape[:2] == (batch_size, 1) and chunk.codes.shape[:2] == (batch_size, 9)
            assert chunk.audio.shape[-1] == 512 * chunk.codes.shape[-1]
            assert chunk.audio[batch_size - 1, 0].shape == (chunk.audio.shape[-1],)


def test_submit_of_a_prefix_built_with_grad_warns_nothing(tiny):
    prefix = _prefix(tiny).detach().requires_grad_(True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        codes = tiny.submit(prefix, max_new_tokens=4, generator=torch.Generator().manual_seed(0)).result()
    assert codes.shape[:2] == (1, 9) and codes.shape[-1] > 0
    assert [str(w.message) for w in caught] == []


def test_audio_prefix_is_continued(tiny):
    prefix = _prefix(tiny)
    audio = torch.randint(0, 1024, (1, 9, 5), generator=torch.Generator().manual_seed(2))
    codes = tiny.generate(prefix, audio_prefix_codes=audio, max_new_tokens=10, progress_bar=False)
    assert torch.equal(codes[..., :5], audio)


def test_callback_stops_generation(tiny):
    seen = []

    def callback(frame, step, max_steps):
        seen.append((frame.shape, step, max_steps))
        return step < 3

    tiny.generate(_prefix(tiny), max_new_tokens=30, progress_bar=False, callback=callback)
    assert [s for _, s, _ in seen] == [1, 2, 3] and seen[0][0] == (1, 9, 1)
    # As upstream and as generate's docstring says: only a true value continues, so None stops after one step.
    codes = tiny.generate(_prefix(tiny), max_new_tokens=30, progress_bar=False, callback=lambda *a: None)
    assert codes.shape[-1] <= 1


def test_eos_runs_down_the_codebooks(tiny):
    """EOS sampled in codebook 0 at column c is followed by EOS in codebook k at column c + k (MASK
    before it); generation stops once codebook 8's EOS is written and returns the frames before the EOS frame."""
    eos_column = 6

    def force_eos(logits, step):
        # Step s writes column s + 1 (no audio prefix): force EOS in codebook 0 at the step writing eos_column.
        forced = torch.full_like(logits[:, 0], float("-inf"))
        forced[:, tiny.eos_token_id] = 0.0
        at = (step == eos_column - 1)[:, None]
        return torch.cat([torch.where(at, forced, logits[:, 0])[:, None], logits[:, 1:]], dim=1)

    columns = {}

    def record(frame, step, max_steps):
        columns[step + 1] = frame[0, :, 0].clone()
        return True

    codes = tiny.generate(
        _prefix(tiny),
        max_new_tokens=40,
        progress_bar=False,
        sampling_params={"min_p": 0.1, "repetition_penalty": 1.0},
        logits_processor=force_eos,
        callback=record,
    )
    # The slot stops itself on the device once codebook 8's EOS is written: no column past it.
    assert max(columns) == eos_column + 8
    for c in range(eos_column, max(columns) + 1):
        k = min(c - eos_column, 8)
        assert columns[c][k] == tiny.eos_token_id
        assert (columns[c][:k] == tiny.masked_token_id).all()
    assert codes.shape[2] == eos_column - 1


def test_bad_inputs(tiny, tmp_path):
    prefix = _prefix(tiny)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tiny.generate(prefix, max_new_tokens=0, progress_bar=False)
    with pytest.raises(ValueError, match="max_seqlen"):
        tiny.generate(prefix, max_new_tokens=1000, progress_bar=False)
    with pytest.raises(ValueError, match="Split the text"):
        _prefix(tiny, text="A long sentence that goes on and on. " * 30)
    with pytest.raises(ValueError, match="prefix_conditioning"):
        tiny.generate(prefix[:, :, :10], progress_bar=False)
    with pytest.raises(ValueError, match="audio_prefix_codes"):
        tiny.generate(prefix, audio_prefix_codes=torch.full((1, 9, 3), 1025), progress_bar=False)
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        tiny.generate(prefix, sampling_params={"top_q": 1}, progress_bar=False)


def test_mismatched_checkpoint_lists_keys(tmp_path):
    def mutate(state):
        state["heads.0.weight"] = state["heads.0.weight"][:1000]
        del state["backbone.norm_f.bias"]
        state["extra.weight"] = torch.zeros(1)

    paths = _save(tmp_path, "hybrid", mutate=mutate)
    with pytest.raises(ValueError) as err:
        Zonos.from_local(*paths, device="cpu")
    msg = str(err.value)
    assert "missing: backbone.norm_f.bias" in msg and "unexpected: extra.weight" in msg
    assert "mis-shaped: heads.0.weight: checkpoint (1000, 64) vs model (1025, 64)" in msg


def test_from_pretrained_local_dir_and_offline_hub(tmp_path, monkeypatch, codec):
    _save(tmp_path, "transformer")
    model = Zonos.from_pretrained(str(tmp_path), device="cpu", autoencoder=codec)
    assert model.dtype == torch.float32 and model.logit_width == 1026
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(FileNotFoundError, match="hf download Zyphra/Zonos-v0.1-hybrid"):
        Zonos.from_pretrained("Zyphra/Zonos-v0.1-hybrid", device="cpu", cache_dir=str(tmp_path / "hf"))


def test_speaker_embedding_conditions_generation(tiny, tmp_path):
    """make_speaker_embedding → make_cond_dict(speaker=...) changes the prefix and generates."""
    from tests.test_speaker import TINY, _speech_like, random_lda, random_state
    from zonos.speaker import SpeakerEmbedding

    tiny.spk_clone_model = SpeakerEmbedding.from_state_dicts(random_state(TINY), random_lda(TINY), config=TINY)
    try:
        speaker = tiny.make_speaker_embedding(_speech_like(1.0, 24000), 24000)
        assert speaker.shape == (1, 1, 128) and speaker.dtype == torch.bfloat16
        cond = make_cond_dict(text="Hello there.", speaker=speaker, device="cpu")
        with_speaker = tiny.prepare_conditioning(cond)
        without = tiny.prepare_conditioning(make_cond_dict(text="Hello there.", device="cpu"))
        assert with_speaker.shape == without.shape and not torch.equal(with_speaker[0], without[0])
        torch.testing.assert_close(with_speaker[1], without[1])  # the unconditional half ignores the speaker
        assert tiny.generate(with_speaker, max_new_tokens=8, progress_bar=False).shape[:2] == (1, 9)
    finally:
        tiny.spk_clone_model = None


def test_accelerators_need_cuda(tmp_path, codec):
    paths = _save(tmp_path, "transformer")
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA device"):
        Zonos.from_local(*paths, device="cpu", autoencoder=codec, cuda_graphs=True)
    with pytest.raises(ValueError, match="fast_ops=True needs the model on a CUDA device"):
        Zonos.from_local(*paths, device="cpu", autoencoder=codec, fast_ops=True)
    with pytest.raises(ValueError, match="use_cute_gemv=True needs the model on a CUDA device"):
        Zonos.from_local(*paths, device="cpu", autoencoder=codec, use_cute_gemv=True)
    with pytest.raises(ValueError, match="use_cute_scan=True needs the model on a CUDA device"):
        Zonos.from_local(*paths, device="cpu", autoencoder=codec, use_cute_scan=True)
    model = Zonos.from_local(*paths, device="cpu", autoencoder=codec)  # auto: nothing to switch on
    assert model.backend.name == "torch" and model._graphs is None
    with pytest.raises(ValueError, match="fused_sampling=True needs the model on a CUDA device"):
        model.use_accelerators(fused_sampling=True)
    with pytest.raises(ValueError, match="fused_blocks=True needs the model on a CUDA device"):
        model.use_accelerators(fused_blocks=True)
    assert model.backend.name == "torch"  # refused before anything changed


def test_heads_run_as_one_matrix(tmp_path, codec):
    """The 9 heads are one (9·1025, d) matrix product whose row blocks are the heads' weights (views, outside
    the state dict), equal to the 9 separate products it replaced, after loading, in-place edits and casts."""
    model = Zonos.from_local(*_save(tmp_path, "hybrid"), device="cpu", autoencoder=codec)  # meta + assign
    assert not any("heads_weight" in k for k in model.state_dict())
    hidden = torch.randn(3, 64)

    def separate(h):
        return torch.stack([torch.nn.functional.linear(h, head.weight) for head in model.heads], dim=1).float()

    assert model.apply_heads(hidden).shape == (3, 9, 1025)
    torch.testing.assert_close(model.apply_heads(hidden), separate(hidden), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        model.heads[4].weight.mul_(-2)  # the fused matrix is the same memory
    torch.testing.assert_close(model.apply_heads(hidden), separate(hidden), rtol=1e-6, atol=1e-6)
    model.double()
    assert model.heads_weight.dtype == torch.float64
    torch.testing.assert_close(model.apply_heads(hidden.double()), separate(hidden.double()), rtol=1e-12, atol=1e-12)
    address = model.heads_weight.data_ptr()
    model.to(torch.float64)
    assert model.heads_weight.data_ptr() == address  # already tied: nothing moves (captured graphs stay valid)
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    assert torch.equal(model.heads_weight[1025:2050], state["heads.1.weight"])
    torch.testing.assert_close(model.apply_heads(hidden.double()), separate(hidden.double()), rtol=1e-12, atol=1e-12)
    assert model.heads_weight.shape[0] == 9232 and not model.heads_weight[9225:].any()  # zero pad to 16 rows


def test_embeddings_run_as_one_table(tmp_path, codec):
    """The 9 code embeddings are one lookup in the stacked tables (views of it, outside the state dict),
    equal to the sum of the 9 separate lookups, after loading, in-place edits and casts."""
    model = Zonos.from_local(*_save(tmp_path, "hybrid"), device="cpu", autoencoder=codec)
    assert not any("embeddings_weight" in k for k in model.state_dict())
    codes = torch.randint(0, 1026, (2, 9, 5))
    codes[0, :, 0] = torch.tensor([0, 1025, 0, 1025, 0, 1025, 0, 1025, 0])  # the first and last row of tables

    def separate(c):
        return sum(torch.nn.functional.embedding(c[:, k], emb.weight) for k, emb in enumerate(model.embeddings))

    torch.testing.assert_close(model.embed_codes(codes), separate(codes), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        model.embeddings[3].weight.mul_(-2)  # the stacked table is the same memory
    torch.testing.assert_close(model.embed_codes(codes), separate(codes), rtol=1e-6, atol=1e-6)
    model.double()
    assert model.embeddings_weight.dtype == torch.float64 and model.embeddings_weight.shape[0] == 9 * 1026
    torch.testing.assert_close(model.embed_codes(codes), separate(codes), rtol=1e-12, atol=1e-12)
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    assert torch.equal(model.embeddings_weight[1026:2052], state["embeddings.1.weight"])
    torch.testing.assert_close(model.embed_codes(codes), separate(codes), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["./no-such-dir", "/no/such/dir", "~/no-such-zonos", "a/b/c"])
def test_a_missing_local_directory_is_named_not_sent_to_the_hub(name, codec):
    with pytest.raises(FileNotFoundError, match="does not exist: pass a local directory holding"):
        Zonos.from_pretrained(name, device="cpu", autoencoder=codec)


def test_a_file_or_an_invalid_repo_id_is_named(tmp_path, codec):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a file, not a directory"):
        Zonos.from_pretrained(str(tmp_path / "model.safetensors"), device="cpu", autoencoder=codec)
    with pytest.raises(FileNotFoundError, match="neither a local directory nor a valid Hugging Face repo id"):
        Zonos.from_pretrained("not a repo id!", device="cpu", autoencoder=codec)


def test_missing_fast_op_packages_on_cuda_warn_unless_asked_for(tiny, monkeypatch):
    """Left at the default on CUDA, Triton ops that cannot be imported fall back to the torch ops with a warning
    that says how to install them; asked for explicitly, the ImportError stands."""
    import zonos_accel.triton as fast  # imports no GPU package

    def missing(*args, **kwargs):
        raise ImportError("No module named 'mamba_ssm'")

    monkeypatch.setattr(type(tiny), "device", property(lambda self: torch.device("cuda")))
    monkeypatch.setattr(fast, "triton_backend", missing)
    with pytest.warns(UserWarning, match=r"Triton fast ops are off \(No module named 'mamba_ssm'\).*\.\[gpu\]"):
        tiny.use_accelerators(cuda_graphs=False)
    with pytest.raises(ImportError, match="mamba_ssm"):
        tiny.use_accelerators(fast_ops=True, cuda_graphs=False)


_NO_DYNAMO_CHILD = """
import sys
from tests.tiny import tiny_codec
from zonos.conditioning import make_cond_dict
from zonos.model import Zonos

directory = sys.argv[1]
model = Zonos.from_local(directory + "/config.json", directory + "/model.safetensors", device="cpu",
                         autoencoder=tiny_codec(), max_seqlen=256)
loaded = "torch._dynamo" in sys.modules
prefix = model.prepare_conditioning(make_cond_dict(text="Hi there.", language="en-us", device="cpu"))
model.autoencoder.decode(model.generate(prefix, max_new_tokens=6, progress_bar=False))
for chunk in model.generate(prefix, max_new_tokens=6, progress_bar=False, stream=True):
    pass
print(f"torch._dynamo imported after from_local: {loaded}, after generating: {'torch._dynamo' in sys.modules}")
"""


@pytest.mark.parametrize("kind", ["hybrid", "transformer"])
def test_loading_and_generating_do_not_import_dynamo(tmp_path, kind):
    """An op on a meta tensor (a module built by from_local, the config's check of its conditioners) imports
    torch._dynamo with sympy: seconds of every process's start. A fresh interpreter loads and generates without."""
    import subprocess
    import sys
    from pathlib import Path

    _save(tmp_path, kind)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _NO_DYNAMO_CHILD, str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = "torch._dynamo imported after from_local: False, after generating: False"
    assert done.stdout.strip().splitlines()[-1] == expected
