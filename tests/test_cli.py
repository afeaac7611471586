"""sample.py end to end on a tiny local checkpoint and codec: one-shot and streamed wavs."""

import soundfile as sf

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
