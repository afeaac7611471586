"""The engine's slots: per-request decode state at fixed addresses, and one decode step over a bucket of them.

Slot ``s`` owns backbone rows ``2s`` (conditional) and ``2s + 1`` (unconditional) of one
:class:`~zonos.backbone.InferenceState`, row ``s`` of the delayed codes and of every per-request tensor
(column offset, remaining steps, guidance scale, seed, sampling parameters). A step over the first ``n`` slots
(a *bucket*) is tensor work only, no host reads: it gathers each slot's last column and repetition window,
runs the backbone step on rows ``0 .. 2n``, guides, samples and writes each active slot's next column. A slot
is active while it has steps left (EOS not yet through the last codebook) and columns left; an inactive slot
in the bucket is computed but changes nothing a request reads, so a CUDA graph of the step serves every mix of
requests.
"""

from __future__ import annotations

import torch

from zonos.backbone import InferenceState
from zonos.backbone.attention import KVCache
from zonos.codebook_pattern import N_CODEBOOKS, UNKNOWN
from zonos.ops.sampler import RowParams, to_device
from zonos.sampling import SamplingParams

MAX_WINDOW = 64  # longest repetition-penalty window a slot holds (upstream's default is 2)


def row_view(state: InferenceState, start: int, stop: int) -> InferenceState:
    """Rows ``start .. stop`` of ``state`` as a state of their own (views: same memory, same addresses)."""
    caches = [
        KVCache(c.k[start:stop], c.v[start:stop]) if isinstance(c, KVCache) else c.rows(start, stop)
        for c in state.caches
    ]
    view = InferenceState(caches, stop - start, state.max_seqlen, state.position.device)
    view.position = state.position[start:stop]
    view.seqlen = None
    return view


def copy_rows(dst: InferenceState, dst_rows: torch.Tensor, src: InferenceState, src_rows: torch.Tensor,
              lengths: torch.Tensor, longest: int) -> None:  # fmt: skip
    """Copy ``src``'s rows ``src_rows`` into ``dst``'s rows ``dst_rows`` (device indexes), row ``k`` having consumed
    ``lengths[k]`` tokens of at most ``longest``: one copy per cache tensor, whatever the rows. Attention caches are
    copied to ``longest``; a shorter row's positions past its length are never read (attention reads a row below
    its position) and the steps overwrite them."""
    for d, s in zip(dst.caches, src.caches):
        if isinstance(d, KVCache):
            for to, of in ((d.k, s.k), (d.v, s.v)):
                to[:, :longest].index_copy_(0, dst_rows, of[:, :longest].index_select(0, src_rows))
        else:
            d.conv.index_copy_(0, dst_rows, s.conv.index_select(0, src_rows))
            d.ssm.index_copy_(0, dst_rows, s.ssm.index_select(0, src_rows))
    dst.position.index_copy_(0, dst_rows, lengths.to(dst.position.dtype))


class Slots:
    """``count`` slots of up to ``max_seqlen`` backbone tokens each, for ``model`` (see the module docstring)."""

    def __init__(self, model, count: int, max_seqlen: int):
        device = model.device
        self.model = model
        self.count = count
        self.max_seqlen = max_seqlen
        self.state = model.backbone.allocate_inference_state(2 * count, max_seqlen)
        self.state.seqlen = None  # rows advance separately; the engine checks each request's length
        i64 = dict(device=device, dtype=torch.int64)
        self.delayed = torch.full((count, N_CODEBOOKS, max_seqlen), UNKNOWN, **i64)
        self.offset = torch.zeros(count, **i64)  # last written column
        self.limit = torch.zeros(count, **i64)  # last column the request may write
        self.remaining = torch.zeros(count, **i64)  # steps left (EOS bookkeeping); 0: inactive
        self.stopping = torch.zeros(count, device=device, dtype=torch.bool)
        # EOS in codebook 0 of the columns the prefill wrote (its sampled token): the steps' flags do not cover it
        self.prefill_eos = torch.zeros(count, device=device, dtype=torch.bool)
        self.cfg = torch.ones(count, device=device, dtype=torch.float32)
        self.seeds = torch.zeros(count, **i64)
        self.steps = torch.zeros(count, **i64)  # the request's step index, for its noise
        self.processor = torch.zeros(count, **i64)  # index into the engine's logits processors (0: none)
        self.params = RowParams.allocate(count, device)
        self.active = torch.zeros(count, device=device, dtype=torch.bool)  # after the last step
        self._window = torch.arange(MAX_WINDOW, device=device)
        self._columns = torch.arange(max_seqlen, device=device)

    def load(
        self,
        slots: list[int],
        staging: InferenceState,
        pairs: list[int],
        lengths: list[int],
        delayed: torch.Tensor,
        offsets: list[int],
        limits: list[int],
        cfg_scales: list[float],
        seeds: list[int],
        params: list[SamplingParams],
        processors: list[int],
    ) -> None:
        """Put prefilled sequences into their slots, sequence ``k`` into ``slots[k]``: the backbone state of
        ``staging``'s row pair ``pairs[k]`` after ``lengths[k]`` tokens, its delayed codes ``delayed[k]`` (9,
        columns) written up to column ``offsets[k]``, its last column ``limits[k]`` and settings. A fixed number of
        launches, whatever the count. The slots stay inactive (steps leave them alone) until :meth:`activate`."""
        device, n = self.offset.device, len(slots)
        # One host transfer per dtype, then device-side copies (element writes from Python would each wait).
        ints = to_device(
            [list(row) for row in zip(slots, offsets, limits, seeds, [1] * n, processors, lengths)], torch.int64, device
        )
        index, offset = ints[:, 0], ints[:, 1]
        for k, buffer in enumerate((self.offset, self.limit, self.seeds, self.steps, self.processor), start=1):
            buffer.index_copy_(0, index, ints[:, k])
        self.cfg.index_copy_(0, index, to_device(cfg_scales, torch.float32, device))
        self.stopping.index_fill_(0, index, False)
        rows = torch.stack([2 * index, 2 * index + 1], 1).flatten()
        sources = to_device([[2 * p, 2 * p + 1] for p in pairs], torch.int64, device).flatten()
        copy_rows(self.state, rows, staging, sources, ints[:, 6].repeat_interleave(2), max(lengths))
        width = delayed.shape[-1]
        self.delayed.index_fill_(0, index, UNKNOWN)
        self.delayed[..., :width].index_copy_(0, index, delayed)
        written = self._columns[:width] <= offset[:, None]
        self.prefill_eos.index_copy_(0, index, ((delayed[:, 0] == self.model.eos_token_id) & written).any(-1))
        self.params.set_rows(slots, params)

    def activate(self, index: torch.Tensor) -> None:
        """Let the next steps run the loaded slots ``index`` (a device index): a request's slots start together,
        when every one of them is loaded (a batched join loads them over several prefills)."""
        # index_fill_/index_copy_, not ``t[index] = value``: a Python value there is copied to the device from
        # pageable memory first, which waits for the queued decode steps (12% of the worker's time under load).
        self.remaining.index_copy_(0, index, self.limit[index] + 1 - self.offset[index])
        self.active.index_fill_(0, index, True)

    def release(self, slot: int) -> None:
        """Deactivate ``slot`` (a finished, stopped or cancelled request): later steps leave it alone."""
        self.remaining[slot : slot + 1].fill_(0)
        self.active[slot : slot + 1].fill_(False)

    def step(self, n: int, use: tuple[bool, ...], processors: tuple) -> None:
        """One decode step of the first ``n`` slots (tensor work only; see the module docstring). ``use`` is
        :func:`zonos.ops.sampler.features` of their requests, ``processors`` the engine's logits processors
        (index ``i`` applies to the slots whose ``processor`` is ``i + 1``)."""
        model = self.model
        w = MAX_WINDOW
        offset = self.offset[:n]
        active = (self.remaining[:n] > 0) & (offset < self.limit[:n])
        columns = offset[:, None] - (w - 1) + self._window  # (n, w): the last w written columns
        valid = (columns >= 0) & (self._window >= w - self.params.window[:n, None])
        recent = self.delayed[:n].gather(2, columns.clamp(min=0)[:, None, :].expand(n, N_CODEBOOKS, w))
        last = torch.where(active[:, None, None], recent[..., -1:], model.masked_token_id)  # valid ids in idle slots
        hidden = model.embed_codes(last).repeat_interleave(2, dim=0)  # (2n, 1, d)
        rows = row_view(self.state, 0, 2 * n)
        out = model.backbone.step(hidden, rows)[:, -1]
        rows.position.sub_((~active).repeat_interleave(2).long())  # inactive rows stay where they are
        logits = model.guided_logits(out, self.cfg[:n])
        steps = self.steps[:n]
        for i, processor in enumerate(processors, start=1):
            if processor is not None:  # (a clone: a processor may edit in place; other rows keep their logits)
                logits = torch.where((self.processor[:n] == i)[:, None, None], processor(logits.clone(), steps), logits)
        ops = model.backbone.ops
        tokens = ops.sample_rows(logits, self.params.head(n), recent, valid, self.seeds[:n], steps, use)
        ops.finish_rows(
            tokens, active, self.delayed[:n], offset, self.limit[:n], self.remaining[:n], self.stopping[:n], steps,
            self.active[:n], model.eos_token_id, model.masked_token_id,
        )  # fmt: skip
