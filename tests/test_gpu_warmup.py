"""The warm-up's compile-ahead pass on the GPU (zonos_accel/compile_ahead.py, Zonos.warmup): in a fresh process with
an empty Triton cache, every kernel the warm-up's requests need is compiled on the compile threads (none at its
first launch), and the engine the pass leaves behind gives the codes a model that never ran a dry run gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, threading, torch
from triton import knobs
from tests.tiny import tiny_codec, tiny_config
from zonos.config import ZonosConfig
from zonos.model import Zonos

threads = []
knobs.runtime.jit_post_compile_hook = lambda **kw: threads.append(threading.current_thread().name)

def build():
    torch.manual_seed(0)
    config = ZonosConfig.from_dict(tiny_config("hybrid"))
    model = Zonos(config, autoencoder=tiny_codec("cuda"), max_seqlen=160).to("cuda", torch.bfloat16).eval()
    model.use_accelerators()
    return model

def codes(model):
    prefix = torch.randn(2, 30, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(3)).bfloat16()
    gen = torch.Generator("cuda").manual_seed(1)
    chunks = list(model.generate(prefix, max_new_tokens=40, progress_bar=False, generator=gen, stream=True))
    return torch.cat([c.codes for c in chunks], -1)

model = build()
model.warmup(prefix_length=30, frames=40, progress_bar=False, compile_ahead=True)
ahead = sum(name.startswith("zonos-compile") for name in threads)
at_launch = len(threads) - ahead
first = codes(model)
model.warmup(prefix_length=30, frames=40, progress_bar=False, compile_ahead=False)
plain = build()  # a model whose engine never ran a dry run
plain.warmup(prefix_length=30, frames=40, progress_bar=False, compile_ahead=False)
print(json.dumps([ahead, at_launch, len(threads), torch.equal(first, codes(plain)), torch.equal(first, codes(model))]))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compile_ahead_compiles_every_kernel_on_threads_and_changes_no_codes(tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    ahead, at_launch, total, same_as_plain, same_again = json.loads(out.stdout.splitlines()[-1])
    assert ahead > 10 and at_launch == 0, (ahead, at_launch)
    assert total == ahead  # the plain model's warm-up found every kernel compiled in memory
    assert same_as_plain and same_again
