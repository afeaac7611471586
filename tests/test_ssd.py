"""The chunked SSD scan equals the token-by-token recurrence (float64), for any length and initial state."""

import pytest
import torch

from zonos.ops import ssd_scan, ssd_step


def _inputs(b, l, h, p, g, n, gen):
    x = torch.randn(b, l, h, p, generator=gen, dtype=torch.float64)
    dt = torch.nn.functional.softplus(torch.randn(b, l, h, generator=gen, dtype=torch.float64) - 1)
    A = -torch.rand(h, generator=gen, dtype=torch.float64) * 2 - 0.1
    B = torch.randn(b, l, g, n, generator=gen, dtype=torch.float64)
    C = torch.randn(b, l, g, n, generator=gen, dtype=torch.float64)
    D = torch.randn(h, generator=gen, dtype=torch.float64)
    return x, dt, A, B, C, D


def _sequential(x, dt, A, B, C, D, state):
    ys = []
    for t in range(x.shape[1]):
        ys.append(ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D))
    return torch.stack(ys, dim=1), state


@pytest.mark.parametrize("length", [1, 7, 255, 256, 257, 1000])
@pytest.mark.parametrize("with_initial", [False, True])
def test_chunked_scan_matches_recurrence(length, with_initial):
    gen = torch.Generator().manual_seed(length * 2 + with_initial)
    b, h, p, g, n = 2, 4, 8, 2, 16
    x, dt, A, B, C, D = _inputs(b, length, h, p, g, n, gen)
    init = torch.randn(b, h, p, n, generator=gen, dtype=torch.float64) if with_initial else None
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=256, D=D, initial_state=init)
    state = init.clone() if with_initial else torch.zeros(b, h, p, n, dtype=torch.float64)
    y_ref, final_ref = _sequential(x, dt, A, B, C, D, state)
    assert torch.linalg.vector_norm(y - y_ref) / torch.linalg.vector_norm(y_ref) <= 1e-10
    assert torch.linalg.vector_norm(final - final_ref) / torch.linalg.vector_norm(final_ref) <= 1e-10


def test_scan_splits_at_any_point():
    """Scanning [0, k) then [k, l) from the handed-over state equals one scan of [0, l)."""
    gen = torch.Generator().manual_seed(5)
    x, dt, A, B, C, D = _inputs(1, 300, 2, 4, 1, 8, gen)
    y, final = ssd_scan(x, dt, A, B, C, chunk_size=64, D=D)
    y1, s1 = ssd_scan(x[:, :101], dt[:, :101], A, B[:, :101], C[:, :101], chunk_size=64, D=D)
    y2, s2 = ssd_scan(x[:, 101:], dt[:, 101:], A, B[:, 101:], C[:, 101:], chunk_size=64, D=D, initial_state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, final, rtol=1e-12, atol=1e-12)
