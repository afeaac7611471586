"""One position per batch row in the attention ops' Triton fast paths: ``decode_attention`` and
``prefill_attention`` (zonos_accel/triton/attention.py) and ``rotate_and_cache`` (zonos_accel/triton/rotary.py).
The engine's slots sit at different positions, so one decode batch carries a (b,) position, (b, l) for rotary.

The kernels run compiled on the GPU or, with TRITON_INTERPRET=1, in Triton's interpreter on the CPU (as in
tests/test_vocoder_ops.py). Each op gets a ragged batch of positions (the middle, 0, the last row, the split
boundaries, random ones) and is compared with its torch reference in float64, and row for row with the same
row run alone at its own scalar position, bit for bit in the op's dtype. Every ``torch.empty`` the ops make (the
outputs and the split partials) starts as NaN, and cache rows a row must not read or write are NaN, so an
element never written or a stray read or write shows. Positions past the cache get the behaviour the kernels
document: the references' masks (every row visible), and no access outside the cache.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernel_checks import TARGETS, kernel_device
from zonos import ops
from zonos.errors import ZonosInputError
from zonos.ops.rotary import rotary_qk

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SMALL = (6, 2, 40, 300)  # (q heads, kv heads, head dim, max_seqlen): 3 query heads per kv head, 3 splits, ragged
REAL = (16, 4, 128, 4096)  # Zonos-v0.1-hybrid's attention; too slow for the interpreter


@pytest.fixture(scope="module", params=TARGETS)
def device(request) -> torch.device:
    return kernel_device(request.param)


@pytest.fixture
def fast(device, monkeypatch):
    """(attention, rotary) kernel modules, with every floating ``torch.empty`` NaN-filled for the test (and
    rotary's fallback to the reference turned into a failure)."""
    from zonos_accel.triton import attention, rotary

    if device.type == "cpu":  # the interpreter has no libdevice
        import types

        import triton.language as tl

        interpreted = types.SimpleNamespace(cos=lambda x: tl.cos(x), sin=lambda x: tl.sin(x))
        monkeypatch.setattr(rotary, "libdevice", interpreted)
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)

    def no_fallback(*args):
        raise AssertionError("rotate_and_cache fell back to the torch reference: the test would not run the kernel")

    monkeypatch.setattr(rotary, "_reference", no_fallback)
    return attention, rotary


def _limits(device: torch.device, dtype: torch.dtype, b: int, heavy: bool = False) -> None:
    """The interpreter runs each program in Python (tens of ms each on CI's 2 cores), so there it runs float32 at
    every batch, float16 at batch 3, and none of the cases that take a minute or more (``heavy``); the GPU runs
    them all."""
    if device.type != "cpu":
        return
    if dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter computes bf16 wrongly (numpy has no bf16)")
    if dtype == torch.float16 and b != 3:
        pytest.skip("the interpreter runs float16 at batch 3 only (the GPU at every batch)")
    if heavy:
        pytest.skip("a minute or more in the interpreter: the GPU runs it")


def _randn(*shape, device, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _ragged(b: int, max_seqlen: int, n: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """(b,) first positions of n-token pieces that fit the cache: the middle, 0, the last (max_seqlen - n), the
    split boundaries of the decode kernel (127, 128), 1, then random ones."""
    fixed = [max_seqlen // 2, 0, max_seqlen - n, 127, 128, 1][:b]
    rest = torch.randint(0, max_seqlen - n + 1, (b - len(fixed),), generator=torch.Generator().manual_seed(seed))
    return torch.tensor(fixed + rest.tolist(), device=device)


def _hide_from(cache: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """A copy of ``cache`` (b, max_seqlen, ...) with each row i's entries from ``ends[i]`` on set to NaN."""
    cache = cache.clone()
    for i, end in enumerate(ends.tolist()):
        cache[i, end:] = float("nan")
    return cache


def _padded(cache: torch.Tensor, before: int, after: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): ``cache`` (b, max_seqlen, ...) copied into the middle of a buffer with NaN rows around each
    batch row, and the view of it the ops get; an access outside the cache reads or leaves those NaNs."""
    b, s = cache.shape[:2]
    buffer = torch.full((b, before + s + after, *cache.shape[2:]), float("nan"), device=cache.device, dtype=cache.dtype)
    view = buffer[:, before : before + s]
    view.copy_(cache)
    return buffer, view


@pytest.mark.parametrize("shape", [SMALL, REAL], ids=["small", "real"])
@pytest.mark.parametrize("b", [1, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_attention_per_row_positions(device, fast, dtype, b, shape):
    attention, _ = fast
    _limits(device, dtype, b, heavy=shape == REAL)
    hq, hkv, d, max_seqlen = shape
    q = _randn(b, 1, hq, d, device=device, dtype=dtype, seed=1)
    k, v = (_randn(b, max_seqlen, hkv, d, device=device, dtype=dtype, seed=s) for s in (2, 3))
    position = _ragged(b, max_seqlen, 1, device)
    ref = ops.decode_attention(q.double(), k.double(), v.double(), position)
    k, v = _hide_from(k, position + 1), _hide_from(v, position + 1)  # a row reading past its own position shows
    out = attention.decode_attention(q, k, v, position)
    assert out.shape == q.shape and out.dtype == dtype
    assert _rel(out, ref) < TOL[dtype]
    for i in range(b):
        alone = attention.decode_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], position[i])
        assert torch.equal(out[i : i + 1], alone), i


@pytest.mark.parametrize("shape,n", [(SMALL, 1), (SMALL, 5), (SMALL, 70), (REAL, 121)], ids=["1", "5", "70", "real"])
@pytest.mark.parametrize("b", [1, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_attention_per_row_positions(device, fast, dtype, b, shape, n):
    attention, _ = fast
    _limits(device, dtype, b, heavy=shape == REAL or (b == 16 and n != 5))
    hq, hkv, d, max_seqlen = shape
    qkv = _randn(b, n, hq + 2 * hkv, d, device=device, dtype=dtype, seed=4)
    q = qkv[:, :, :hq]  # a strided view of the fused projection, as the layer passes it
    k, v = (_randn(b, max_seqlen, hkv, d, device=device, dtype=dtype, seed=s) for s in (5, 6))
    position = _ragged(b, max_seqlen, n, device)
    ref = ops.prefill_attention(q.double(), k.double(), v.double(), position)
    k, v = _hide_from(k, position + n), _hide_from(v, position + n)  # rows no query of the row sees
    out = attention.prefill_attention(q, k, v, position)
    assert out.shape == q.shape and out.dtype == dtype
    assert _rel(out, ref) < TOL[dtype]
    for i in range(b):
        alone = attention.prefill_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], position[i])
        assert torch.equal(out[i : i + 1], alone), i


ROTARY = {  # (q heads, kv heads, head dim, rotary dim, interleaved)
    "real": (16, 4, 128, 128, False),
    "interleaved": (4, 2, 16, 8, True),
    "partial": (3, 1, 40, 24, False),  # channels past the rotary ones are copied
}


def _nan_caches(b: int, max_seqlen: int, hk: int, d: int, device, dtype, margin: int):
    """((k buffer, k cache), (v buffer, v cache)): all NaN, each cache inside ``margin`` rows of its buffer."""
    nan = torch.full((b, max_seqlen, hk, d), float("nan"), device=device, dtype=dtype)
    return _padded(nan, margin, margin), _padded(nan, margin, margin)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaNs where NaNs."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("layout", ROTARY)
@pytest.mark.parametrize("l", [1, 3])
@pytest.mark.parametrize("b", [1, 3, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotate_and_cache_per_row_positions(device, fast, dtype, b, l, layout):
    _, rotary = fast
    _limits(device, dtype, b, heavy=b == 16 and (layout == "real" or l == 3))
    hq, hk, d, rotary_dim, interleaved = ROTARY[layout]
    max_seqlen, m = 300, 2
    qkv = _randn(b, l, (hq + 2 * hk) * d, device=device, dtype=dtype, seed=7)
    q, k, v = torch.split(qkv, [hq * d, hk * d, hk * d], -1)  # strided views of the fused projection
    q, k, v = q.view(b, l, hq, d), k.view(b, l, hk, d), v.view(b, l, hk, d)
    positions = _ragged(b, max_seqlen, l, device)[:, None] + torch.arange(l, device=device)  # (b, l)
    ref_k, ref_v = (torch.zeros(b, max_seqlen, hk, d, device=device, dtype=dtype) for _ in range(2))
    ref_q = ops.rotate_and_cache(q, k, v, ref_k, ref_v, positions, rotary_dim, 10000.0, interleaved)
    (k_buffer, k_cache), (v_buffer, v_cache) = _nan_caches(b, max_seqlen, hk, d, device, dtype, m)
    out = rotary.rotate_and_cache(q, k, v, k_cache, v_cache, positions, rotary_dim, 10000.0, interleaved)
    assert out.shape == q.shape and out.dtype == dtype
    assert _rel(out, ref_q) < TOL[dtype]
    rows = torch.arange(b, device=device)[:, None]
    assert _rel(k_cache[rows, positions], ref_k[rows, positions]) < TOL[dtype]
    assert torch.equal(v_cache[rows, positions], v)  # values are copied, not rounded
    for i in range(b):  # each row alone, at its own (l,) positions: the same query, the same cache rows
        (k_alone, k_view), (v_alone, v_view) = _nan_caches(1, max_seqlen, hk, d, device, dtype, m)
        args = (positions[i], rotary_dim, 10000.0, interleaved)
        alone = rotary.rotate_and_cache(q[i : i + 1], k[i : i + 1], v[i : i + 1], k_view, v_view, *args)
        assert torch.equal(out[i : i + 1], alone), i
        assert _same(k_buffer[i : i + 1], k_alone) and _same(v_buffer[i : i + 1], v_alone), i
    for buffer in (k_buffer, v_buffer):
        buffer[:, m:-m][rows, positions] = float("nan")  # the rows written, checked above
        assert buffer.isnan().all()  # no other row of the cache, nor outside it, was written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_positions_past_the_cache(device, fast, dtype):
    """What the kernels document for positions the caller rules out: attention at or past max_seqlen sees every
    row (the references' masks), reads nothing outside the cache and leaves the split counters at zero (a later
    call that merges splits is still right); rotate_and_cache rotates the query but writes no key or value of a
    token outside [0, max_seqlen)."""
    attention, rotary = fast
    _limits(device, dtype, 3)
    hq, hkv, d, max_seqlen = SMALL
    b = 5
    k, v = (_randn(b, max_seqlen, hkv, d, device=device, dtype=dtype, seed=s) for s in (8, 9))
    (_, k_view), (_, v_view) = _padded(k, 0, 40), _padded(v, 0, 40)  # NaN rows after each row's cache
    q = _randn(b, 1, hq, d, device=device, dtype=dtype, seed=10)
    past = torch.tensor([max_seqlen - 1, max_seqlen, max_seqlen + 77, 200, 10**6], device=device)
    ref = ops.decode_attention(q.double(), k.double(), v.double(), past)
    assert _rel(attention.decode_attention(q, k_view, v_view, past), ref) < TOL[dtype]
    merging = torch.tensor([250, 129, 299, 200, 140], device=device)  # 2 or 3 splits each
    ref = ops.decode_attention(q.double(), k.double(), v.double(), merging)
    assert _rel(attention.decode_attention(q, k_view, v_view, merging), ref) < TOL[dtype]

    n = 5
    qp = _randn(b, n, hq, d, device=device, dtype=dtype, seed=11)
    first = torch.tensor([max_seqlen - n, max_seqlen - 2, max_seqlen + 10, 0, 150], device=device)
    ref = ops.prefill_attention(qp.double(), k.double(), v.double(), first)
    assert _rel(attention.prefill_attention(qp, k_view, v_view, first), ref) < TOL[dtype]

    hq, hk, d, rotary_dim, interleaved = ROTARY["real"]
    l, m = 3, 3
    q, k, v = (_randn(2, l, h, d, device=device, dtype=dtype, seed=s) for h, s in ((hq, 12), (hk, 13), (hk, 14)))
    positions = torch.tensor([[max_seqlen - 2, max_seqlen - 1, max_seqlen], [-1, 0, 1]], device=device)
    (k_buffer, k_cache), (v_buffer, v_cache) = _nan_caches(2, max_seqlen, hk, d, device, dtype, m)
    out = rotary.rotate_and_cache(q, k, v, k_cache, v_cache, positions, rotary_dim, 10000.0, interleaved)
    assert _rel(out, rotary_qk(q, k, positions, rotary_dim, 10000.0, interleaved)[0]) < TOL[dtype]
    inside = [(0, 0, max_seqlen - 2), (0, 1, max_seqlen - 1), (1, 1, 0), (1, 2, 1)]  # (row, token, position)
    for row, token, pos in inside:
        assert torch.equal(v_cache[row, pos], v[row, token])
        assert torch.isfinite(k_cache[row, pos]).all()
    for buffer in (k_buffer, v_buffer):
        for row, _, pos in inside:
            buffer[row, m + pos] = float("nan")
        assert buffer.isnan().all()  # nothing else written: not the rows of position -1 or max_seqlen


def test_position_shapes_are_checked():
    """Before any launch (so on any machine): a position that is neither shared nor one per row."""
    pytest.importorskip("triton")
    from zonos_accel.triton import attention, rotary

    q = torch.zeros(3, 1, 6, 40)
    k = torch.zeros(3, 300, 2, 40)
    with pytest.raises(ZonosInputError, match=r"position has shape \(2,\).*\(3,\)"):
        attention.decode_attention(q, k, k, torch.tensor([1, 2]))
    with pytest.raises(ZonosInputError, match=r"position has shape \(3, 1\)"):
        attention.prefill_attention(q, k, k, torch.zeros(3, 1, dtype=torch.long))
    with pytest.raises(ZonosInputError, match=r"positions has shape \(2, 1\).*\(1,\).*\(3, 1\)"):
        positions = torch.zeros(2, 1, dtype=torch.long)
        rotary.rotate_and_cache(q, k[:, :1], k[:, :1], k, k.clone(), positions, 40, 10000.0, False)


@pytest.mark.parametrize("shape", [SMALL, (16, 4, 128, 600)], ids=["small", "real-heads"])
def test_decode_attention_512_rows(device, fast, shape):
    """The split counters (one per batch row and kv head) at the largest slot count the engine plans for, each
    row at its own position."""
    attention, _ = fast
    if device.type != "cuda":
        pytest.skip("512 rows take minutes in the interpreter; the batches above cover the logic")
    hq, hkv, d, max_seqlen = shape
    b = attention.COUNTER_ROWS
    q = _randn(b, 1, hq, d, device=device, dtype=torch.bfloat16, seed=20)
    k, v = (_randn(b, max_seqlen, hkv, d, device=device, dtype=torch.bfloat16, seed=s) for s in (21, 22))
    position = _ragged(b, max_seqlen, 1, device, seed=23)
    out = attention.decode_attention(q, k, v, position)
    ref = ops.decode_attention(q.double(), k.double(), v.double(), position)
    assert _rel(out, ref) < TOL[torch.bfloat16]
    for i in (0, 1, 2, b // 2, b - 1):
        alone = attention.decode_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], position[i])
        assert torch.equal(out[i : i + 1], alone), i


def test_decode_graphs_keep_their_counters_when_a_batch_outgrows_them(device, fast):
    """Slot buckets are graphs captured on views of one cache, which share its split counters. A batch larger than
    the counters cover replaces them; the old set must stay allocated for the graphs that captured it (a graph
    holds no reference): otherwise other tensors reuse its memory and the replayed merges go wrong."""
    attention, _ = fast
    if device.type != "cuda":
        pytest.skip("CUDA graphs")
    hq, hkv, d, max_seqlen = SMALL
    rows = attention.COUNTER_ROWS + 8
    q = _randn(rows, 1, hq, d, device=device, dtype=torch.bfloat16, seed=30)
    k, v = (_randn(rows, max_seqlen, hkv, d, device=device, dtype=torch.bfloat16, seed=s) for s in (31, 32))
    position = torch.tensor([250, 140], device=device)  # 2 and 3 splits: both merge through the counters
    attention.decode_attention(q[:2], k[:2], v[:2], position)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.decode_attention(q[:2], k[:2], v[:2], position)
    attention.decode_attention(q, k, v, torch.full((rows,), 260, device=device))  # outgrows the counters
    junk = [torch.full((attention.COUNTER_ROWS * hkv,), 1, device=device, dtype=torch.int32) for _ in range(16)]
    for p in ([250, 140], [0, 299], [129, 128]):
        position.copy_(torch.tensor(p))
        graph.replay()
        ref = ops.decode_attention(q[:2].double(), k[:2].double(), v[:2].double(), position)
        assert _rel(out, ref) < TOL[torch.bfloat16], p
    del junk
