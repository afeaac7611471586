"""The vocoder slab: streams joining and leaving between pushes, every row pushed every time, each stream's samples
equal to its one-shot decode (float64, CPU, a tiny random DAC with the real strides and kernels)."""

from __future__ import annotations

import pytest
import torch

from tests.replay_on_cpu import emulate_cuda_graphs
from tests.tiny import TINY_DAC, random_dac_weights
from zonos.codec import DACAutoencoder, DACConfig
from zonos.codec.slab import OPEN_END, VocoderSlab


@pytest.fixture(scope="module")
def codec() -> DACAutoencoder:
    config = DACConfig(**TINY_DAC)
    codec = DACAutoencoder(config, random_dac_weights(config))
    codec.dac.double()
    return codec


def _run_streams(slab: VocoderSlab, plans: dict, seed: int) -> tuple[dict, dict]:
    """Drive ``slab`` through ``plans`` (stream -> (row, push at which it joins, frames into that push it starts
    at, length, whether its end is known at the start)); rows outside a stream's frames get random codes.
    Returns each stream's samples and its codes."""
    g = torch.Generator().manual_seed(seed)
    t = slab.frames
    codes = {i: torch.randint(0, 1024, (1, 9, p[3]), generator=g) for i, p in plans.items()}
    out = {i: [] for i in plans}
    first = {}  # stream -> its row's first frame at the next push
    done = set()
    for push in range(200):
        for i, (row, join, start, length, known) in plans.items():
            if join == push:
                assert all(plans[j][0] != row for j in first if j not in done), "the plan reuses a live row"
                first[i] = -start
                slab.admit(row, -start, length if known else OPEN_END)
        live = {i: plans[i][0] for i in first if i not in done}
        if not live and len(done) == len(plans):
            break
        n = max(live.values(), default=-1) + 1
        if n == 0:
            continue
        batch = torch.randint(0, 1024, (n, 9, t), generator=g)  # garbage wherever no stream's frame is
        for i, row in live.items():
            lo, hi = max(first[i], 0), min(first[i] + t, plans[i][3])
            if hi > lo:
                batch[row, :, lo - first[i] : hi - first[i]] = codes[i][0, :, lo:hi]
            if not plans[i][4] and first[i] + t >= plans[i][3]:  # the stream's last frames are in this push
                slab.set_end(row, plans[i][3])
        audio = slab.push(batch)
        for i, row in live.items():
            start, stop, position = slab.samples(first[i], plans[i][3])
            out[i].append(audio[row, :, start - position : stop - position])
            first[i] += t
            if slab.drained(first[i], plans[i][3]):
                done.add(i)
    assert done == set(plans)
    return {i: torch.cat(o, -1) for i, o in out.items()}, codes


# stream -> (row, join push, start within the push, frames, end known at the start)
PLANS = {0: (0, 0, 0, 23, True), 1: (1, 0, 3, 9, False), 2: (2, 2, 1, 1, True), 3: (1, 9, 2, 30, False),
         4: (3, 1, 0, 14, False)}  # fmt: skip


@pytest.mark.parametrize("frames", [4, 3])
def test_each_row_decodes_its_stream_as_the_one_shot_decode(codec, frames):
    """Five streams (one a single frame, one reusing a drained stream's row) joining at different pushes and at
    different frames within them, ends known at the start or set as they come: each stream's samples equal its
    one-shot decode to float64 rounding, with the same length."""
    slab = VocoderSlab(codec, rows=4, frames=frames, cuda_graphs=False)
    audio, codes = _run_streams(slab, PLANS, seed=frames)
    for i, a in audio.items():
        ref = codec.decode(codes[i]).double()
        assert a.shape == ref[0].shape, i
        assert torch.allclose(a.double(), ref[0], rtol=0, atol=1e-10), (i, float((a - ref[0]).abs().max()))


def test_graph_replays_give_the_eager_samples(codec, monkeypatch):
    """With (emulated) CUDA graphs every bucket's push replays from its second occurrence on and gives the eager
    slab's samples bit for bit: the layers' ranges are read from a buffer the replays see."""
    emulate_cuda_graphs(monkeypatch)
    eager = _run_streams(VocoderSlab(codec, rows=4, frames=4, cuda_graphs=False), PLANS, seed=1)[0]
    slab = VocoderSlab(codec, rows=4, frames=4)
    graphed = _run_streams(slab, PLANS, seed=1)[0]
    assert slab.decoder.graph_replays > 0
    for i in PLANS:
        assert torch.equal(graphed[i], eager[i]), i


def test_bad_pushes_are_refused(codec):
    slab = VocoderSlab(codec, rows=2, frames=4, cuda_graphs=False)
    with pytest.raises(ValueError, match="slab push takes"):
        slab.push(torch.zeros(3, 9, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="slab push takes"):
        slab.push(torch.zeros(1, 9, 5, dtype=torch.long))
    with pytest.raises(IndexError, match="row 2"):
        slab.admit(2, 0)
