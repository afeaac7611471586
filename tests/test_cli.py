"""sample.py end to end on a tiny local checkpoint and codec: one-shot and streamed wavs."""

import pytest
import soundfile as sf
import torch

import sample
from tests.tiny import save_tiny_checkpoint, tiny_codec


def test_sample_cli_one_shot_and_stream(tmp_path, capsys):
    model_dir, codec_dir = tmp_path / "model", tmp_path / "codec"
    model_dir.mkdir()
    save_tiny_checkpoint(model_dir, "transformer")
    tiny_codec().save_pretrained(codec_dir)
    common = ["--model", str(model_dir), "--codec", str(codec_dir), "--device", "cpu", "--seed", "1"]
    common += ["--max-new-tokens", "20", "--no-progress", "--text", "Testing one, two."]
    assert sample.main([*common, "--out", str(tmp_path / "a.wav")]) == 0
    assert sample.main([*common, "--out", str(tmp_path / "b.wav"), "--stream", "--chunk-frames", "3"]) == 0
    a, sr_a = sf.read(tmp_path / "a.wav")
    b, sr_b = sf.read(tmp_path / "b.wav")
    assert sr_a == sr_b == 44100 and len(a) == len(b) > 0 and len(a) % 512 == 0
    assert abs(a - b).max() < 1e-4  # the same seed streams the same audio
    assert "time to first audio" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--text", "  "], "--text is empty"),
        (["--language", "english"], "--language: unsupported language 'english'"),
        (["--chunk-frames", "4"], "--chunk-frames applies only to streaming: add --stream"),
        (["--stream", "--first-chunk-frames", "0"], "--first-chunk-frames must be at least 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--speaker-embedding", "a.pt", "--speaker-audio", "a.wav"], "not both"),
        (["--device", "cpu", "--cute-gemv"], "drop --cute-gemv, or run on a GPU"),
        (["--device", "nonsense"], "--device:"),
    ],
)
def test_bad_arguments_stop_before_loading_with_what_to_do(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        sample.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_cuda_device_without_cuda_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        sample.parse_args(["--device", "cuda"])
    assert "torch sees no CUDA device here; use --device cpu" in capsys.readouterr().err


def test_a_missing_model_directory_is_an_error_message_not_a_traceback(tmp_path, capsys):
    code = sample.main(["--model", str(tmp_path / "missing"), "--codec", str(tmp_path / "missing"), "--device", "cpu"])
    assert code == 2 and "does not exist: pass a local directory" in capsys.readouterr().err
