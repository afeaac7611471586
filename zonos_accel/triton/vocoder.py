"""The DAC decoder's convolutions (``zonos.ops.conv1d``, ``conv_transpose1d``, ``sequence_tail``) as Triton
kernels: one launch per conv, with bias, residual, tanh and the next conv's Snake applied before the store.

Each conv is an implicit GEMM on tensor cores: a program owns a tile of output channels × output samples of
one batch row and walks the reduction (input channels × taps, taps padded to a power of two with zeros) in
slices of a fixed size.  The reduction order depends only on the layer's shape, and the output tile, chosen
per call, does not change it, so every output sample is the same sum, in the same order, whatever the length
of the input and wherever the sample lies in it: the streaming decoder, which feeds ``[history | new]``
windows, gets the one-shot decode's samples bit for bit.  (cuDNN picks its algorithm by input length: its
16-bit stream was 56.6 dB from one-shot on an H200.)  A transposed conv runs as ``stride`` phase convs: output
sample ``u = q s + r`` sums taps ``r + m s`` of inputs ``q - m``.  One program computes every phase of its
channels as rows of one product, so each input slice serves all phases and the outputs are stored as contiguous
rows (a program per phase stored one sample every ``stride``: one L2 sector write per sample, which made the
upsampling layers 2-3x slower per frame than the k7 convs).

The reduction is summed in groups of ``GROUP_REDUCE`` elements, each from zero, and the groups' sums are added
in order.  A call with few output tiles (a streaming push) runs the groups of a tile in parallel programs and the
one that finishes last adds them (split-K, one launch); a long call runs them one after another in one program.
Both add the same numbers in the same order, so the split changes the time, not the samples.  Nor does the slice
(the elements of one loop step, longer in a call with few tiles): within a group every slice's ``tl.dot``
continues the one chain of 16-deep products.

A short call (a streaming push, a short decode's first layers) reads dense operands instead of gathering them:
its input unfolded once into contiguous reduction rows (by ``_unfold``, or by the ``sequence_tail`` that made
its window, in the same launch) and its weights packed once per weight tensor, both loaded as 16-byte vectors
(unfolded rows padded to 16 columns; the padding's outputs are never stored) and pipelined ``DENSE_STAGES``
slices deep.  The dot products see the same numbers in the same order, so this
too changes the time, not the samples.

A call of many batch rows with only a few outputs each (a vocoder slab's first layers: 4 samples a row at 4-frame
pushes) tiles the rows' (row, sample) pairs together instead (``FLAT``): each column gathers its own row's inputs,
each weight slice serves a whole tile, and every output is still the same chain of products.

The k7 convs of at most :data:`TAP_MAJOR_CHANNELS` channels (blocks 3-4's, and the last conv) run tap-major
instead, on sm_90 and later: their input copied channels-last, each reduction slice is a TMA box of ``BLOCK_CI``
channels shifted along the samples by the tap (the boxes' zeros outside the input are the padding), so neither a
gather nor an unfolded copy is needed, and a stream window hands the conv its channels-last copy (one value per
sample, not 8 unfolded taps).  The sum is one chain, tap by tap, whatever the call's length, so streamed and one-shot
calls of a layer still agree bit for bit.  On the H200 the one-shot decode went from 0.029 to 0.021 ms per frame
(cuDNN: 0.031), and streamed pushes cost what they did (docs/BENCHMARKS.md, decisions: TAP_MAJOR_CHANNELS).

Snake stays a launch of its own (:mod:`.snake`): applied as a conv loaded its input, it was recomputed for
every tap and channel tile, which made these kernels 5x slower than cuDNN one-shot (H200).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.tools.tensor_descriptor import TensorDescriptor

from zonos.ops import vocoder as reference
from zonos.ops.vocoder import Scratch
from zonos.utils import tensor_version
from zonos_accel.triton.snake import snake_fp32

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}

# Tuning constants, in one place.  Each line gives the H200 measurement that chose the value; docs/BENCHMARKS.md,
# decisions, has the command and the alternatives of each.  Tiles, slices, stages, splits and DENSE_BYTES change the
# time, not the samples (the GPU tests check it bit for bit); GROUP_REDUCE and TAP_MAJOR_CHANNELS fix a layer's
# summation order, the same for its streamed and one-shot calls.
#
# Reduction elements (input channels × padded taps) per slice, one loop step of a program, in a call with many
# output tiles and in one with few (a streaming push's layers).  Slices of any size chain the same 16-deep products
# in the same order.  128 for every call spilled on long calls (one-shot 0.339 against 0.038 ms/frame at 64); the
# few programs of a short call gain from fewer steps (2-frame pushes 0.177 against 0.189 ms/frame at 64).
REDUCE = 64
SHORT_REDUCE = 128
# Reduction elements per group (a split-K program's share); each group's sum starts from zero.  512 and 1024 tie
# from 2-frame pushes on (0.456 vs 0.462 ms/frame); no split: 0.725.
GROUP_REDUCE = 1024
# Output tiles (BLOCK_CO, BLOCK_T) of long calls, largest first.  With 16 or 32 channels they run mma.sync m16n8k16,
# so each output is the same chain of 16-deep products whatever the tile.  32 x 64: one-shot 0.039 ms/frame (16 x 64:
# 0.048).
TILES = ((32, 64), (32, 32))
# The tiles of calls with fewer output tiles than that (a streaming push's layers; see :func:`_blocks`): 16 samples
# wide took conv1 and block 1's upsample at 2-frame pushes from 16.3 and 31.0 to 10.4 and 14.2 us.
SHORT_TILES = ((32, 16), (16, 16), (32, 32), (16, 32))
# Tiles of 64 channels for plain convs of 64 channels or more, widest first: a 32-channel tile re-reads a layer's
# unfolded input from L2 once per 32 channels (block 2's k7 conv at 8 frames: 75 MB in 14 us).  They run wgmma on
# sm_90, whose sums the GPU tests find bit for bit those of mma.sync.  Block 2's k7 conv 14.3 -> 10.6 us at 8-frame
# pushes, 22.5 -> 15.3 at 16; one-shot convs 30.3 -> 22.8 us per frame.  The transposed convs keep 32 channels.
WIDE_TILES = ((64, 64), (64, 32), (64, 16))
# A call takes the widest of the first two WIDE_TILES that makes this many programs per SM (split groups counted),
# else the widest of the last two that makes one per SM, else the tiles above: within 3% of the best tile per layer
# at 8- and 16-frame pushes.
WIDE_PROGRAMS_PER_SM = 1.5
# A call splits its reduction groups over programs while it has fewer output tiles than this many per SM: below 4
# against below 1, a 2-frame push's convs 193 against 201 us; block 1's k7 convs at 16 frames 25.6 -> 20.1 us.
SPLIT_TILES_PER_SM = 4
# Rows of a transposed conv's program: output channels × the phases it computes together (all of them where the
# stride is a power of two, so that its stores are contiguous rows and each input slice serves every phase).  64:
# the upsampling layers of 2 / 8 / 16-frame pushes 30 / 34 / 39 us (one phase per program: 33 / 54 / 78), one-shot
# 1.2 us per frame (3.4); 32 rows lost at 8 and 16 frames and one-shot, 128 rows at every push size.
TRANSPOSED_ROWS = 64
# A call of at least FLAT_ROWS batch rows with fewer than FLAT_COLUMNS outputs per row (a vocoder slab's conv1 and
# block 1's upsample: 4-5 a row at 4-frame pushes) tiles the (row, sample) pairs together (``FLAT``), gathering: a
# row's own tiles were mostly padding and re-read the layer's weights once per row (conv1: 22 MB a row).  At 256 rows
# x 4 frames conv1 1735 -> 318 us, the upsample 1421 -> 292 (H100); block 1's k7 convs (32 a row) lost, 1010 -> 1150
# gathering and 116 -> 400 against their dense calls at 64 rows.  Tiles (BLOCK_CO, BLOCK_T, warps), widest first: the
# first that still gives every SM a program.
FLAT_ROWS = 4
FLAT_COLUMNS = 32
FLAT_TILES = ((128, 128, 8), (128, 64, 8), (64, 64, 4))
# A call whose unfolded input (:func:`_unfold`) takes at most this many bytes runs on dense operands; a longer one
# gathers its inputs in the kernel (unfolded, a long decode's last layers would take gigabytes).  Dense k7 convs:
# 1.3-2.7x faster at push sizes.
DENSE_BYTES = 32 << 20
# Slices in flight in a dense call's reduction (0: one ahead, as the gather): 4 stages 0.137 ms/frame at 2-frame
# pushes, 6 0.139, 8 0.145 (fewer programs per SM), gathering 0.218.
DENSE_STAGES = 4
# Convs of kernel > 1 over at most this many input channels (a multiple of 32) run tap-major (:func:`_conv_taps`)
# where TMA exists (sm_90 on): blocks 3-4's k7 convs and the DAC's last conv; their stream windows hand on a
# channels-last copy (one value per sample) instead of 8 unfolded taps.  Block 3's k7 conv with its window 15.9 ->
# 12.2 us at 8-frame pushes, 24.0 -> 14.6 at 16; block 2's (384 channels) 14.1 -> 15.9 at 8, and in the whole decoder
# 384 cost 3-10% more at 2-8-frame pushes; 768 was slower at every size.  One-shot 0.029 -> 0.021 ms/frame.  In a
# slab push of 256 rows x 4 frames, though, blocks 1-2's k7 convs gather at 67-84 TFLOP/s (1.0 and 1.6 ms each, H100)
# against block 3's tap-major 287 (0.47 ms): wider tap-major convs are the slab's next candidate (not yet timed).
TAP_MAJOR_CHANNELS = 192
TAP_MAJOR_STAGES = 4  # TMA boxes in flight (not swept)
# Programs of a window launch (:func:`sequence_tail`), (most samples, elements, warps) each.  Writing a channels-last
# copy: 32 samples x 16 channels on 2 warps took 3.4-7.2 us, the best of 9 shapes (64 x 64 elements: 11-14 us).
CHANNELS_LAST_TILE = (32, 512, 2)
# A window alone, and a window that also writes the next conv's unfolded taps: of 60 shapes (128-2048 samples x 1-8
# channels, 2-8 warps) none was more than 7% faster; both launches take what copying their bytes takes.
WINDOW_TILE = (1024, 2048, 4)
UNFOLD_WINDOW_TILE = (256, 256, 4)
# A window launch's narrowest block of new samples: pushes of up to this many new samples share one specialization
# (the ramp-up's small pushes compiled one each: 43 compiles of the window kernel, 21.8 s, on a cold H100 host).
NARROWEST_WINDOW_BLOCK = 64


@triton.jit
def _load_sequence(h_ptr, x_ptr, H, n, b, c, c_ok, pos, s_hb, s_hc, s_ht, s_xb, s_xc, s_xt):
    """Samples ``pos`` of channels ``c`` of ``[history | x]`` in fp32; zeros outside ``0 .. H + n - 1``."""
    c = c.to(tl.int64)  # a long decode's (C, T) plane can pass 2**31 elements
    in_h = (pos >= 0) & (pos < H)
    in_x = (pos >= H) & (pos < H + n)
    vh = tl.load(h_ptr + b * s_hb + c * s_hc + pos * s_ht, mask=c_ok & in_h, other=0.0)
    vx = tl.load(x_ptr + b * s_xb + c * s_xc + (pos - H) * s_xt, mask=c_ok & in_x, other=0.0)
    return tl.where(in_h, vh.to(tl.float32), vx.to(tl.float32))


@triton.jit
def _load_input(x_ptr, T_x, b, ci, ok, pos, s_xb, s_xc, s_xt, COMPUTE: tl.constexpr):
    """The reduction slice of the input: channels ``ci`` at samples ``pos``, zeros outside ``0 .. T_x - 1`` (the
    padding)."""
    mask = ok & (pos >= 0) & (pos < T_x)
    v = tl.load(x_ptr + b * s_xb + ci.to(tl.int64) * s_xc + pos * s_xt, mask=mask, other=0.0)
    return v.to(COMPUTE)


@triton.jit
def _slice(
    x_ptr, w_ptr, T_x, ci_end, b, ci, tap, row, pos, co, co_ok, s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, COMPUTE,
    DENSE: tl.constexpr, PACKED: tl.constexpr,
):  # fmt: skip
    """(weights, inputs) of one reduction slice: input channels ``ci`` (below ``ci_end``) at taps ``tap`` and
    samples ``pos``.  ``DENSE``: the inputs are the unfolded ``[C_in KP, T_x]`` rows (``row = ci KP + tap``), loaded as
    contiguous rows.  ``PACKED``: so are the weights, rows ``co`` of ``[rows, C_in KP]`` (zero taps)."""
    in_rows = row < ci_end * KP
    ok = (ci < ci_end) & (tap < K)
    if DENSE:
        v = tl.load(
            x_ptr + b * s_xb + row[:, None].to(tl.int64) * s_xc + pos, mask=in_rows[:, None] & (pos < T_x), other=0.0
        ).to(COMPUTE)
    else:
        v = _load_input(x_ptr, T_x, b, ci[:, None], ok[:, None], pos, s_xb, s_xc, s_xt, COMPUTE)
    if PACKED:
        w = tl.load(w_ptr + co[:, None] * s_wo + row[None, :], mask=co_ok[:, None] & in_rows[None, :], other=0.0)
    else:
        w = tl.load(
            w_ptr + co[:, None] * s_wo + ci[None, :] * s_wi + tap[None, :] * s_wk,
            mask=co_ok[:, None] & ok[None, :],
            other=0.0,
        )
    return w.to(COMPUTE), v


@triton.jit
def _reduce(
    x_ptr, w_ptr, T_x, ci_first, ci_end, b, ci, tap, r, pos, co, co_ok, s_xb, s_xc, s_xt, s_wo, s_wi, s_wk,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_T: tl.constexpr,
    COMPUTE: tl.constexpr, PRECISION: tl.constexpr, DENSE: tl.constexpr, STAGES: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    """The sum over input channels ``ci_first .. ci_end - 1`` from zero, in slices of ``BLOCK_CI`` channels in
    channel order.  Dense operands with ``STAGES``: Triton's pipeline keeps that many slices' loads in flight
    (the same dots in the same order); else each slice is loaded one iteration ahead of its dot."""
    acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
    if DENSE and STAGES > 0:
        for ci0 in tl.range(ci_first, ci_end, BLOCK_CI, num_stages=STAGES):
            w, v = _slice(
                x_ptr, w_ptr, T_x, ci_end, b, ci0 + ci, tap, ci0 * KP + r, pos, co, co_ok,
                s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, COMPUTE, DENSE, PACKED,
            )  # fmt: skip
            acc = tl.dot(w, v, acc, input_precision=PRECISION)
    else:
        w, v = _slice(
            x_ptr, w_ptr, T_x, ci_end, b, ci_first + ci, tap, ci_first * KP + r, pos, co, co_ok,
            s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, COMPUTE, DENSE, PACKED,
        )  # fmt: skip
        for ci0 in range(ci_first + BLOCK_CI, ci_end + BLOCK_CI, BLOCK_CI):
            w_next, v_next = _slice(
                x_ptr, w_ptr, T_x, ci_end, b, ci0 + ci, tap, ci0 * KP + r, pos, co, co_ok,
                s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, COMPUTE, DENSE, PACKED,
            )  # fmt: skip
            acc = tl.dot(w, v, acc, input_precision=PRECISION)
            w, v = w_next, v_next
    return acc


@triton.jit
def _sum(
    x_ptr, w_ptr, part_ptr, count_ptr, tile, group, n_groups, T_x, C_in, b, ci, tap, r, pos, co, co_ok,
    s_xb, s_xc, s_xt, s_wo, s_wi, s_wk,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_T: tl.constexpr,
    GROUP: tl.constexpr, SPLIT: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr, DENSE: tl.constexpr,
    STAGES: tl.constexpr, PACKED: tl.constexpr,
):  # fmt: skip
    """(sum, whether this program stores it): the groups' sums (each of ``GROUP`` slices, from zero)
    added in group order.  With ``SPLIT`` this program sums group ``group`` of the ``tile`` and publishes it;
    the program that finishes the tile's last group adds them all."""
    group_ci = GROUP * BLOCK_CI
    total = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
    if SPLIT:
        first = group * group_ci
        part = _reduce(
            x_ptr, w_ptr, T_x, first, tl.minimum(first + group_ci, C_in), b, ci, tap, r, pos, co, co_ok,
            s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, BLOCK_CO, BLOCK_CI, BLOCK_T, COMPUTE, PRECISION, DENSE, STAGES,
            PACKED,
        )  # fmt: skip
        cell = tl.arange(0, BLOCK_CO)[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
        parts = part_ptr + tile.to(tl.int64) * n_groups * BLOCK_CO * BLOCK_T
        tl.store(parts + group * BLOCK_CO * BLOCK_T + cell, part)
        # The barrier puts every warp's stores before the count, which one thread makes; the atomic orders
        # them before it (release) and the last count before that program's loads (acquire).  The last
        # program resets the count for the next launch.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        last = arrived == n_groups - 1
        if last:
            for g in range(0, n_groups):
                total += tl.load(parts + g * BLOCK_CO * BLOCK_T + cell, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        last = True
        for first in range(0, C_in, group_ci):
            total += _reduce(
                x_ptr, w_ptr, T_x, first, tl.minimum(first + group_ci, C_in), b, ci, tap, r, pos, co, co_ok,
                s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, BLOCK_CO, BLOCK_CI, BLOCK_T, COMPUTE, PRECISION, DENSE,
                STAGES, PACKED,
            )  # fmt: skip
    return total, last


@triton.jit
def _batch_and_group(n_groups, SPLIT: tl.constexpr):
    """The grid's third axis: the batch row (× phase) and, with ``SPLIT``, the reduction group."""
    if SPLIT:
        return (tl.program_id(2) // n_groups).to(tl.int64), tl.program_id(2) % n_groups
    return tl.program_id(2).to(tl.int64), 0


@triton.jit
def _tile(row):
    """This program's output tile, numbered over the grid (what a split's partials and count are filed by)."""
    return (row * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _epilogue(acc, b_ptr, s_b, co, co_ok, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):
    if HAS_BIAS:
        bias = tl.load(b_ptr + co * s_b, mask=co_ok, other=0.0).to(COMPUTE).to(tl.float32)
        acc = acc + bias[:, None]
    return acc.to(COMPUTE)


@triton.jit
def _activate(y, a_ptr, s_a, co, co_ok, TANH: tl.constexpr, SNAKE: tl.constexpr, COMPUTE: tl.constexpr):
    """A conv's output after its tanh, or the next conv's Snake (as the Snake kernel computes it on this output)."""
    if TANH:
        y = libdevice.tanh(y.to(tl.float32)).to(COMPUTE)
    if SNAKE:
        alpha = tl.load(a_ptr + co * s_a, mask=co_ok, other=1.0).to(tl.float32)[:, None]
        y = snake_fp32(y.to(tl.float32), alpha).to(COMPUTE)
    return y


# The batch size is read only by FLAT calls (to find a column's row); unspecialized, it adds no compiles (Triton would
# compile each kernel again for a batch of 1 and for batches that are multiples of 16: every slab bucket).
@triton.jit(do_not_specialize=["batch"])
def _conv_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, rh_ptr, a_ptr, out_ptr, part_ptr, count_ptr,
    C_in, C_out, T_x, n_out, offset, dilation, T_r, H_r, res_offset, n_groups,
    s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, s_b, s_a,
    s_rb, s_rc, s_rt, s_rhb, s_rhc, s_rht, s_ob, s_oc, s_ot,
    batch,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_T: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, TANH: tl.constexpr, SNAKE: tl.constexpr, GROUP: tl.constexpr,
    SPLIT: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr, DENSE: tl.constexpr, STAGES: tl.constexpr,
    FLAT: tl.constexpr,
):  # fmt: skip
    """``FLAT``: the tile's columns run over (batch row, output sample) pairs, ``n_out`` samples of row 0, then of row
    1 and so on (many rows of a few samples each: every weight slice serves a whole tile), gathering each column's
    inputs from its own row; else the grid's third axis is the batch row."""
    co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    if FLAT:
        column = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        t = column % n_out
        # Columns past the last row read row batch - 1 (a valid address) and are not stored.
        b = tl.minimum(column // n_out, batch - 1).to(tl.int64)[None, :]
        t_ok = column < batch * n_out
        group = tl.program_id(2) if SPLIT else 0
        tile = _tile(0)
    else:
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        b, group = _batch_and_group(n_groups, SPLIT)
        t_ok = t < n_out
        tile = _tile(b)
    co_ok = co < C_out
    r = tl.arange(0, BLOCK_CI * KP)  # reduction index: input channel r // KP, tap r % KP
    tap = r % KP
    if DENSE:
        pos = t[None, :]
    else:
        pos = t[None, :] + (tap * dilation + offset)[:, None]
    acc, last = _sum(
        x_ptr, w_ptr, part_ptr, count_ptr, tile, group, n_groups, T_x, C_in, b, r // KP, tap, r, pos, co, co_ok,
        s_xb, s_xc, s_xt, s_wo, s_wi, s_wk, K, KP, BLOCK_CO, BLOCK_CI, BLOCK_T, GROUP, SPLIT, COMPUTE, PRECISION,
        DENSE, STAGES, DENSE,
    )  # fmt: skip
    y = _epilogue(acc, b_ptr, s_b, co, co_ok, HAS_BIAS, COMPUTE)
    if HAS_RES:
        res = _load_sequence(
            rh_ptr, r_ptr, H_r, T_r, b, co[:, None], co_ok[:, None], res_offset + t[None, :],
            s_rhb, s_rhc, s_rht, s_rb, s_rc, s_rt,
        )  # fmt: skip
        y = (y.to(tl.float32) + res).to(COMPUTE)
    y = _activate(y, a_ptr, s_a, co, co_ok, TANH, SNAKE, COMPUTE)
    mask = co_ok[:, None] & t_ok[None, :]
    if SPLIT:  # only the program that adds the groups stores (a select: Triton 3.9's interpreter refuses the mask
        mask = tl.where(last, mask, False)  # that ``mask & last`` makes of a scalar)
    tl.store(out_ptr + b * s_ob + co[:, None].to(tl.int64) * s_oc + t[None, :] * s_ot, y, mask=mask)


@triton.jit
def _conv_taps_kernel(
    x_desc, w_desc, b_ptr, a_ptr, out_ptr, C_in, C_out, n_out, offset, dilation, s_b, s_a, s_ob, s_oc, s_ot,
    K: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr,
    TANH: tl.constexpr, SNAKE: tl.constexpr, COMPUTE: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """A tap-major conv (:func:`_conv_taps`): the reduction walks tap by tap, ``BLOCK_CI`` channels at a time, each
    slice of the channels-last input ``[B, T, C_in]`` a TMA box shifted by the tap along T (zeros outside the input:
    the padding), each weight slice a box of the packed ``[C_out, K C_in]``; one chain of products from zero."""
    t0 = tl.program_id(0) * BLOCK_T
    co0 = tl.program_id(1) * BLOCK_CO
    b = tl.program_id(2)
    acc = tl.zeros((BLOCK_CO, BLOCK_T), dtype=tl.float32)
    chunks = C_in // BLOCK_CI
    for i in tl.range(0, K * chunks, num_stages=STAGES):
        tap = i // chunks
        ci0 = (i - tap * chunks) * BLOCK_CI
        w = w_desc.load([co0, tap * C_in + ci0])
        v = tl.reshape(x_desc.load([b, t0 + tap * dilation + offset, ci0]), (BLOCK_T, BLOCK_CI))
        acc = tl.dot(w, tl.trans(v), acc)
    co = co0 + tl.arange(0, BLOCK_CO)
    t = t0 + tl.arange(0, BLOCK_T)
    co_ok = co < C_out
    y = _epilogue(acc, b_ptr, s_b, co, co_ok, HAS_BIAS, COMPUTE)
    y = _activate(y, a_ptr, s_a, co, co_ok, TANH, SNAKE, COMPUTE)
    mask = co_ok[:, None] & (t < n_out)[None, :]
    tl.store(out_ptr + b.to(tl.int64) * s_ob + co[:, None].to(tl.int64) * s_oc + t[None, :] * s_ot, y, mask=mask)


@triton.jit(do_not_specialize=["batch"])
def _conv_transpose_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    C_in, C_out, T_x, stride, start, length, q_first, n_q, n_groups,
    s_xb, s_xc, s_xt, s_w, s_b, s_ob, s_oc, s_ot, batch,
    K: tl.constexpr, MP: tl.constexpr, BLOCK_CO: tl.constexpr, PHASES: tl.constexpr, BLOCK_CI: tl.constexpr,
    BLOCK_Q: tl.constexpr, HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr, COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr, DENSE: tl.constexpr, STAGES: tl.constexpr, ALL_PHASES: tl.constexpr,
    FLAT: tl.constexpr,
):  # fmt: skip
    """A program computes ``PHASES`` consecutive phases of ``BLOCK_CO`` output channels as one product: its rows
    are (channel, phase) pairs of the packed weights (``[stride C_out, C_in MP]``, row ``phase C_out + channel``)
    and they share each input slice.  Its outputs, phases interleaved, are then stored as runs of ``PHASES``
    samples (``ALL_PHASES``: contiguous rows), not one sample every ``stride``.  ``FLAT``: the columns run over
    (batch row, input) pairs, ``n_q`` inputs of row 0, then of row 1 and so on, as in :func:`_conv_kernel`."""
    BLOCK_M: tl.constexpr = BLOCK_CO * PHASES
    qi = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    i = tl.arange(0, BLOCK_M)
    co = tl.program_id(1) * BLOCK_CO + i // PHASES
    row, group = _batch_and_group(n_groups, SPLIT)  # row: batch row × phase groups + phase group (FLAT: the latter)
    n_phase_groups = stride // PHASES
    first_phase = (row % n_phase_groups) * PHASES
    if FLAT:
        b = tl.minimum(qi // n_q, batch - 1).to(tl.int64)[None, :]  # columns past the last row are not stored
        qi = qi % n_q
    else:
        b = row // n_phase_groups
    q = q_first + qi
    co_ok = co < C_out
    r = tl.arange(0, BLOCK_CI * MP)  # reduction index: input channel r // MP, input q - r % MP
    m = r % MP
    if DENSE:  # the unfolded rows are every phase's
        pos = qi[None, :]
    else:
        pos = q[None, :] - m[:, None]
    acc, last = _sum(
        x_ptr, w_ptr, part_ptr, count_ptr, _tile(row), group, n_groups, T_x, C_in, b, r // MP, m * stride, r, pos,
        (first_phase + i % PHASES) * C_out + co, co_ok, s_xb, s_xc, s_xt, s_w, 0, 0, K, MP, BLOCK_M, BLOCK_CI,
        BLOCK_Q, GROUP, SPLIT, COMPUTE, PRECISION, DENSE, STAGES, True,
    )  # fmt: skip
    y = _epilogue(acc, b_ptr, s_b, co, co_ok, HAS_BIAS, COMPUTE)
    # Rows (channel, phase) -> each channel's samples in order: column j is input q0 + j // PHASES, phase j % PHASES.
    j = tl.arange(0, BLOCK_Q * PHASES)
    if PHASES > 1:
        y = tl.reshape(tl.permute(tl.reshape(y, (BLOCK_CO, PHASES, BLOCK_Q)), (0, 2, 1)), (BLOCK_CO, BLOCK_Q * PHASES))
    column = tl.program_id(0) * BLOCK_Q + j // PHASES
    if FLAT:
        b_out = tl.minimum(column // n_q, batch - 1).to(tl.int64)[None, :]
        q_out, in_range = column % n_q, column < batch * n_q
    else:
        b_out = b
        q_out, in_range = column, column < n_q
    if ALL_PHASES and not FLAT:  # the same samples, written so that Triton sees contiguous rows
        t = (q_first + tl.program_id(0) * BLOCK_Q) * stride - start + j
    else:
        t = (q_first + q_out) * stride + first_phase + j % PHASES - start
    ok = in_range & (t >= 0) & (t < length)
    c = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)
    mask = (c < C_out)[:, None] & ok[None, :]
    if SPLIT:
        mask = tl.where(last, mask, False)
    tl.store(out_ptr + b_out * s_ob + c[:, None].to(tl.int64) * s_oc + t[None, :] * s_ot, y, mask=mask)


@triton.jit
def _unfold_kernel(
    x_ptr, cols_ptr, C, T_x, n_cols, first, step, s_xb, s_xc, s_xt, s_cb, s_cr,
    K: tl.constexpr, KP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Row ``c KP + k`` of ``cols`` is input channel ``c`` at samples ``first + k step + t``, in ``cols``' dtype
    (what the conv would load for tap ``k`` and output ``t``); zeros outside the input and for ``k >= K``."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(2).to(tl.int64)
    c = rows // KP
    k = rows % KP
    pos = first + t[None, :] + (k * step)[:, None]
    ok = ((c < C) & (k < K))[:, None] & (pos >= 0) & (pos < T_x)
    v = tl.load(x_ptr + b * s_xb + c[:, None].to(tl.int64) * s_xc + pos * s_xt, mask=ok, other=0.0)
    out = cols_ptr + b * s_cb + rows[:, None].to(tl.int64) * s_cr + t[None, :]
    tl.store(out, v.to(cols_ptr.dtype.element_ty), mask=(rows < C * KP)[:, None] & (t < n_cols)[None, :])


@triton.jit
def _scatter_taps(cols, s_cr, c64, p, ok, v, first, step, n_cols, K: tl.constexpr, KP: tl.constexpr):
    """Window samples ``v`` (rows ``c64``, positions ``p``) into the unfolded rows ``c KP + k`` that read them: column
    ``t = p - first - k step`` for tap ``k < K``; zeros for the padded taps ``k >= K``, at tap ``K - 1``'s columns
    (those cover every column once when the window covers every tap's samples)."""
    for k in tl.static_range(KP):
        if k < K:
            t = p - first - k * step
            val = v
        else:
            t = p - first - (K - 1) * step
            val = tl.zeros_like(v)
        tl.store(cols + (c64 * KP + k) * s_cr + t, val, mask=ok & (t >= 0) & (t < n_cols))


# Lengths, offsets and the strides that follow them change with every push size: not specialized (Triton would
# compile once per pattern of which of them are 1 or multiples of 16). None of them can make an access provably
# aligned anyway (every access starts at a runtime offset such as H + n - length); the sample strides stay
# specialized (1: contiguous runs), as do the channels-last copy's and the unfolded rows' strides (multiples of 16).
_TAIL_UNSPECIALIZED = ("H", "n", "length", "H_r", "length_r", "n_cols", "first", "step", "s_hb", "s_hc", "s_xb", "s_xc",
                       "s_ob", "s_oc", "s_rhb", "s_rhc", "s_rob", "s_roc")  # fmt: skip


@triton.jit(do_not_specialize=_TAIL_UNSPECIALIZED)
def _tail_kernel(
    h_ptr, x_ptr, alpha_ptr, out_ptr, rh_ptr, rout_ptr, cols_ptr, valid_ptr, C, H, n, length, H_r, length_r, s_a,
    n_cols, first, step, s_hb, s_hc, s_ht, s_xb, s_xc, s_xt, s_ob, s_oc, s_ot, s_rhb, s_rhc, s_rht, s_rob, s_roc,
    s_rot, s_cb, s_cr, s_vb,
    BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_X: tl.constexpr, SNAKE: tl.constexpr, RAW: tl.constexpr,
    K: tl.constexpr, KP: tl.constexpr, UNFOLD: tl.constexpr, CHANNELS_LAST: tl.constexpr, VALID: tl.constexpr,
):  # fmt: skip
    """The last ``length`` samples of ``[history | x]`` (Snake's outputs for x with ``SNAKE``); with ``RAW`` also
    the last ``length_r`` of ``[raw history | x]`` (x as it is), which take the same samples of x (the wrapper
    checks it); with ``UNFOLD`` also the window unfolded for the conv that reads it next (``_unfold``'s rows
    ``c KP + k``: window samples ``first + k step + t``, ``t < n_cols``), each window sample stored into every
    column that reads it as it is stored into the window: no program reads what another writes; with
    ``CHANNELS_LAST`` instead a ``[length, C]`` copy of the window for a tap-major conv (row ``t`` at ``s_cr t``);
    with ``VALID`` the samples of x outside row b's ``[valid[b, 0], valid[b, 1])`` are read as zeros."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    b = tl.program_id(2).to(tl.int64)
    c_ok = (c < C)[:, None]
    c64 = c.to(tl.int64)[:, None]
    start = H + n - length  # the first kept sample of [history | x]
    n_h = tl.maximum(H - start, 0)  # how many come from the history (the front of out)
    n_x = length - n_h
    # Blocks of x's kept samples, counted from the end: block 0 holds the last BLOCK_X of them.
    j = n_x - (tl.program_id(1) + 1) * BLOCK_X + tl.arange(0, BLOCK_X)
    x_ok = c_ok & ((j >= 0) & (j < n_x))[None, :]
    x_in = x_ok
    if VALID:
        lo = tl.load(valid_ptr + b * s_vb)
        hi = tl.load(valid_ptr + b * s_vb + 1)
        x_in = x_ok & ((n - n_x + j >= lo) & (n - n_x + j < hi))[None, :]
    v_in = tl.load(x_ptr + b * s_xb + c64 * s_xc + (n - n_x + j)[None, :] * s_xt, mask=x_in, other=0.0)
    v = v_in.to(tl.float32)
    if SNAKE:
        v = snake_fp32(v, tl.load(alpha_ptr + c * s_a, mask=c < C, other=1.0).to(tl.float32)[:, None])
    v = v.to(out_ptr.dtype.element_ty)
    out_rows = out_ptr + b * s_ob + c64 * s_oc
    raw_rows = rout_ptr + b * s_rob + c64 * s_roc
    cols = cols_ptr + b * s_cb
    n_hr = length_r - n_x
    if tl.program_id(1) == 0:
        # out may be the leading samples of the history's buffer.  The kept history then overlaps at most the
        # last n_h <= BLOCK_X samples out gets from x, which this program writes: it reads all first (the same
        # for the raw tail).
        i = tl.arange(0, BLOCK_H)
        h_ok = c_ok & (i < n_h)[None, :]
        kept = tl.load(h_ptr + b * s_hb + c64 * s_hc + (start + i)[None, :] * s_ht, mask=h_ok, other=0.0)
        if RAW:
            r_ok = c_ok & (i < n_hr)[None, :]
            kept_r = tl.load(rh_ptr + b * s_rhb + c64 * s_rhc + (H_r - n_hr + i)[None, :] * s_rht, mask=r_ok)
        tl.debug_barrier()
        tl.store(out_rows + i[None, :] * s_ot, kept, mask=h_ok)
        if RAW:
            tl.store(raw_rows + i[None, :] * s_rot, kept_r, mask=r_ok)
        if UNFOLD:
            _scatter_taps(cols, s_cr, c64, i[None, :], h_ok, kept, first, step, n_cols, K, KP)
        if CHANNELS_LAST:
            tl.store(cols + i[None, :] * s_cr + c64, kept, mask=h_ok)
    tl.store(out_rows + (n_h + j)[None, :] * s_ot, v, mask=x_ok)
    if RAW:
        tl.store(raw_rows + (n_hr + j)[None, :] * s_rot, v_in.to(rout_ptr.dtype.element_ty), mask=x_ok)
    if UNFOLD:
        _scatter_taps(cols, s_cr, c64, (n_h + j)[None, :], x_ok, v, first, step, n_cols, K, KP)
    if CHANNELS_LAST:
        tl.store(cols + (n_h + j)[None, :] * s_cr + c64, v, mask=x_ok)


# -- wrappers ------------------------------------------------------------------------------------------


def _compute(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype or torch.promote_types(x.dtype, weight.dtype)


def _check(x: torch.Tensor, history: torch.Tensor | None, c_in: int, what: str) -> torch.Tensor:
    if x.dim() != 3 or x.shape[1] != c_in:
        raise ValueError(f"{what} takes x [B, {c_in}, T]; got {tuple(x.shape)}")
    if history is None:
        return x  # stands in for the history pointer, with H = 0
    if history.dtype != x.dtype or history.shape[:2] != x.shape[:2] or history.device != x.device:
        raise ValueError(
            f"history {tuple(history.shape)} {history.dtype} does not continue x {tuple(x.shape)} {x.dtype}"
        )
    return history


def _wide(c_out: int, c_in: int, taps: int, n_out: int, batch: int, sm: int) -> tuple[int, int, int] | None:
    """(BLOCK_CO, BLOCK_T, programs) of a plain conv's 64-channel tile (:data:`WIDE_TILES`), or None to use
    :data:`TILES` / :data:`SHORT_TILES`.  No tile wider than the call (a 2-frame push's 2 columns take 16)."""
    if c_out < 64:
        return None
    n_groups = triton.cdiv(c_in, GROUP_REDUCE // triton.next_power_of_2(taps))
    widest = max(16, triton.next_power_of_2(n_out))

    def programs(block_co: int, block_t: int) -> int:
        tiles = triton.cdiv(n_out, block_t) * triton.cdiv(c_out, block_co) * batch
        return tiles * (n_groups if n_groups > 1 and tiles < SPLIT_TILES_PER_SM * sm else 1)

    for need, tiles in ((WIDE_PROGRAMS_PER_SM * sm, WIDE_TILES[:2]), (sm, WIDE_TILES[1:])):
        for block_co, block_t in tiles:
            if block_t <= widest and programs(block_co, block_t) >= need:
                return block_co, block_t, programs(block_co, block_t)
    return None


def _blocks(
    c_out: int, c_in: int, taps: int, n_out: int, batch: int, phases: int, device: torch.device
) -> tuple[int, int, int, int]:
    """(BLOCK_CO, BLOCK_CI, BLOCK_T, warps) of a call with ``n_out`` outputs per channel in ``batch`` × ``phases``
    rows.  A plain conv (one phase) of 64 channels or more takes a tile of :data:`WIDE_TILES` (:func:`_wide`),
    with the longer slices of :data:`SHORT_REDUCE` while its programs fit two per SM and the tile is at most 32
    samples wide (64 × 64 with them: 15.3 against 10.1 us for block 4's k7 convs at 16-frame pushes).
    Otherwise the output tile is the largest of :data:`TILES` that still gives each SM two programs (a long
    decode: more reuse of each load).  A call with fewer tiles (a streaming push) takes a tile of
    :data:`SHORT_TILES`, as measured per layer: 16 samples wide when it has fewer than 32 per row (not half a tile
    of padding), and 32 channels tall when its reduction spans several groups (the layers that hold most of the
    weights: fewer, fuller programs per group), except for transposed convs with 32 samples or more, whose phases
    already make many programs; and the longer slices of :data:`SHORT_REDUCE` unless 16 × 32 tiles would still
    give each SM two programs.  Neither the tile nor the slice changes the sums (a GPU test checks it)."""
    rows = batch * phases
    sm = _sm_count(device)
    enough = 2 * sm
    slice_taps = triton.next_power_of_2(taps)
    wide = _wide(c_out, c_in, taps, n_out, batch, sm) if phases == 1 else None
    if wide is not None:
        block_co, block_t, programs = wide
        reduce = SHORT_REDUCE if programs <= enough and block_t <= 32 else REDUCE
        return block_co, max(1, reduce // slice_taps), block_t, 4
    for block_co, block_t in TILES:
        if triton.cdiv(n_out, block_t) * triton.cdiv(c_out, block_co) * rows >= enough:
            return block_co, max(1, REDUCE // slice_taps), block_t, 4
    reduce = REDUCE if triton.cdiv(n_out, 32) * triton.cdiv(c_out, 16) * rows >= enough else SHORT_REDUCE
    block_t = 16 if n_out < 32 else 32
    groups = c_in * slice_taps > GROUP_REDUCE
    block_co = 32 if groups and (block_t == 16 or phases == 1) else 16
    return block_co, max(1, reduce // slice_taps), block_t, 4


def _flat(batch: int, n_out: int) -> bool:
    """Whether a call of ``batch`` rows of ``n_out`` outputs (a transposed conv's: inputs per phase) tiles its rows'
    samples together, gathering (:data:`FLAT_ROWS`); a property of the call's shape, which ``sequence_tail`` reads
    to skip the unfolded copy that such a call does not use."""
    return batch >= FLAT_ROWS and n_out < FLAT_COLUMNS


def _flat_blocks(rows: int, c_in: int, taps: int, columns: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_CI, BLOCK_N, warps) of a flat call with ``rows`` output rows (a transposed conv's: channels ×
    phases) and ``columns`` (row, sample) pairs: the widest of :data:`FLAT_TILES` that gives each SM a program
    (split groups counted), with :data:`REDUCE`'s slices (the sums do not depend on either)."""
    sm = _sm_count(device)
    slice_taps = triton.next_power_of_2(taps)
    n_groups = triton.cdiv(c_in, GROUP_REDUCE // slice_taps)
    for tile in FLAT_TILES:
        tiles = triton.cdiv(columns, tile[1]) * triton.cdiv(rows, tile[0])
        if tiles * (n_groups if _split(n_groups, tiles, device) else 1) >= sm:
            break
    block_m, block_n, warps = tile
    return block_m, max(1, REDUCE // slice_taps), block_n, warps


def _transposed_blocks(
    c_out: int, c_in: int, taps: int, n_q: int, batch: int, stride: int, device: torch.device
) -> tuple[int, int, int, int, int]:
    """(BLOCK_CO, PHASES, BLOCK_CI, BLOCK_Q, warps) of a transposed conv with ``n_q`` inputs per phase: the
    largest power of two dividing the stride as phases per program (every phase for the DAC's strides),
    :data:`TRANSPOSED_ROWS` rows of (channel, phase), and the slice and width that :func:`_blocks` gives a plain
    conv of that many rows."""
    phases = stride & -stride
    block_co = max(1, TRANSPOSED_ROWS // phases)
    rows = triton.cdiv(c_out, block_co) * TRANSPOSED_ROWS
    _, block_ci, block_q, warps = _blocks(rows, c_in, taps, n_q, batch, 1, device)
    return block_co, phases, block_ci, block_q, warps


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # Triton's interpreter: as on an H200
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split(n_groups: int, tiles: int, device: torch.device) -> bool:
    """Whether a call runs its reduction groups in parallel programs: when its output tiles alone leave SMs
    short of programs (a streaming push).  Either way the sums are the same."""
    return n_groups > 1 and tiles < SPLIT_TILES_PER_SM * _sm_count(device)


def _split_buffers(
    tiles: int, n_groups: int, block_co: int, block_t: int, like: torch.Tensor, scratch: Scratch | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial sums, counts) of a split launch.  The counts are each tile's finished groups, zero between launches
    (the last program resets them).  A caller's ``scratch`` keeps them for good (a larger one replaces them for a
    call with more tiles, which only a forced split makes), as its captured CUDA graphs hold their address: its
    calls run one after another, a caller on another CUDA stream has its own.  Without one they are new zeros."""
    if scratch is None:
        counts = torch.zeros(tiles, dtype=torch.int32, device=like.device)
    else:
        kept = scratch.kept.setdefault(("split counts", like.device), [])
        if not kept or kept[-1].numel() < tiles:
            size = max(tiles, SPLIT_TILES_PER_SM * _sm_count(like.device))
            kept.append(torch.zeros(size, dtype=torch.int32, device=like.device))
        counts = kept[-1]
    parts = torch.empty(tiles * n_groups * block_co * block_t, dtype=torch.float32, device=like.device)
    return parts, counts


def _groups(c_in: int, block_ci: int, taps: int) -> tuple[int, int]:
    """(groups, slices per group) of a reduction over ``c_in`` channels × ``taps`` padded taps in slices of
    ``block_ci`` channels: groups of :data:`GROUP_REDUCE` elements, whatever the slice."""
    group_ci = max(block_ci, GROUP_REDUCE // taps)
    return triton.cdiv(c_in, group_ci), group_ci // block_ci


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 exactly; the 16-bit dtypes ignore it


def _bias_args(bias: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, int]:
    return (like, 0) if bias is None else (bias, bias.stride(0))


def _dense(batch: int, rows: int, n: int, dtype: torch.dtype) -> bool:
    return batch * rows * _padded(n) * dtype.itemsize <= DENSE_BYTES


def _padded(n: int) -> int:
    """Unfolded rows' width: a multiple of 16 elements.  The dense convs read the padding columns too (their outputs
    are never stored), so that both a row's stride and the loads' bound are multiples of 16, which Triton's launches
    specialize on: only then are a row's loads 16-byte asynchronous copies rather than 2-byte loads (at a 2-frame
    push's first two layers, 2 and 8 columns wide, they were 2-byte loads; sm_90a PTX)."""
    return -(-n // 16) * 16


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """sm_90 or later; Triton's interpreter (CPU tensors) runs tensor-descriptor loads too."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def _tap_major(c_in: int, k: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a conv with ``c_in`` input channels and kernel ``k`` runs tap-major (no residual): a property of the
    layer alone, so that every call of a layer, streamed or one-shot, adds the same products in the same order."""
    return (
        k > 1
        and c_in % 32 == 0
        and c_in <= TAP_MAJOR_CHANNELS
        and dtype in (torch.float16, torch.bfloat16)
        and _has_tma(device)
    )


def _taps_blocks(c_out: int, c_in: int, n_out: int, batch: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_CO, BLOCK_CI, BLOCK_T) of a tap-major call.  The slice ``BLOCK_CI`` depends on the layer only (it orders
    the sum); the tile is the widest that keeps the SMs busy: 64 samples for long calls, 16 for the shortest, and
    none wider than a row's outputs (a slab's rows of 32)."""
    block_co = 64 if c_out >= 64 else 16
    block_ci = 64 if c_in % 64 == 0 else 32
    rows = triton.cdiv(c_out, block_co) * batch
    sm = _sm_count(device)
    widest = max(16, triton.next_power_of_2(n_out))
    if triton.cdiv(n_out, 64) * rows >= 8 * sm and widest >= 64:
        return block_co, block_ci, 64
    return block_co, block_ci, 32 if triton.cdiv(n_out, 32) * rows >= sm and widest >= 32 else 16


def _conv_taps(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    alpha: torch.Tensor | None,
    out: torch.Tensor,
    padding: int,
    dilation: int,
    tanh: bool,
    dtype: torch.dtype,
    scratch: Scratch | None,
) -> torch.Tensor:
    """:func:`conv1d` without a residual, tap-major: on a channels-last copy of ``x`` (the one its window's
    ``sequence_tail`` made, else made here) read by TMA boxes shifted tap by tap, which also supply the padding's
    zeros, against the weights packed ``[C_out, K C_in]``."""
    c_out, c_in, k = weight.shape
    batch, n_out = x.shape[0], out.shape[-1]
    rows = _handed_off(x, ("channels-last", dtype), scratch)
    if rows is None:
        rows = x.to(dtype).transpose(1, 2).contiguous()
    w = _packed(weight, ("taps", dtype), lambda w: w.permute(0, 2, 1).reshape(c_out, k * c_in).to(dtype).contiguous())
    block_co, block_ci, block_t = _taps_blocks(c_out, c_in, n_out, batch, x.device)
    x_desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [1, block_t, block_ci])
    w_desc = TensorDescriptor(w, list(w.shape), list(w.stride()), [block_co, block_ci])
    b_ptr, s_b = _bias_args(bias, weight)
    a = weight if alpha is None else alpha.reshape(c_out)
    grid = (triton.cdiv(n_out, block_t), triton.cdiv(c_out, block_co), batch)
    _conv_taps_kernel[grid](
        x_desc, w_desc, b_ptr, a, out, c_in, c_out, n_out, -padding, dilation, s_b,
        0 if alpha is None else a.stride(0), *out.stride(),
        K=k, BLOCK_CO=block_co, BLOCK_CI=block_ci, BLOCK_T=block_t, HAS_BIAS=bias is not None, TANH=tanh,
        SNAKE=alpha is not None, COMPUTE=_TL_DTYPES[dtype], STAGES=TAP_MAJOR_STAGES, num_warps=4,
        enable_fp_fusion=alpha is None,  # Snake rounded as torch rounds it
    )  # fmt: skip
    return out


def _unfold(x: torch.Tensor, k: int, kp: int, first: int, step: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, C kp, n]`` (rows padded to :func:`_padded`, the padding left unwritten): row ``c kp + j`` holds channel
    ``c`` at samples ``first + j step .. + n - 1`` in ``dtype``, zeros outside ``x`` and for ``j >= k``: the reduction
    rows of an implicit GEMM written out once, so the conv loads contiguous rows instead of gathering them for every
    tile of output channels (at a streaming push's few samples the gather's index arithmetic took most of the time)."""
    batch, c, _ = x.shape
    cols = torch.empty(batch, c * kp, _padded(n), dtype=dtype, device=x.device)
    block_t = min(128, max(16, triton.next_power_of_2(n)))
    block_r = 4096 // block_t
    grid = (triton.cdiv(c * kp, block_r), triton.cdiv(n, block_t), batch)
    _unfold_kernel[grid](
        x, cols, c, x.shape[-1], n, first, step, *x.stride(), cols.stride(0), cols.stride(1),
        K=k, KP=kp, BLOCK_R=block_r, BLOCK_T=block_t, num_warps=4,
    )  # fmt: skip
    return cols


def _pack_conv(weight: torch.Tensor, kp: int, dtype: torch.dtype) -> torch.Tensor:
    """``[C_out, C_in kp]`` in ``dtype``: each output channel's reduction row, taps padded with zeros."""
    c_out, c_in, k = weight.shape
    packed = weight.new_zeros(c_out, c_in, kp, dtype=dtype)
    packed[..., :k] = weight
    return packed.reshape(c_out, c_in * kp)


def _pack_transposed(weight: torch.Tensor, stride: int, mp: int, dtype: torch.dtype) -> torch.Tensor:
    """``[stride, C_out, C_in mp]`` in ``dtype``: phase ``r``'s row ``c mp + m`` is tap ``r + m stride`` (zero past
    the kernel)."""
    c_in, c_out, k = weight.shape
    padded = weight.new_zeros(c_in, c_out, mp * stride, dtype=dtype)
    padded[..., :k] = weight
    return padded.reshape(c_in, c_out, mp, stride).permute(3, 1, 0, 2).reshape(stride, c_out, c_in * mp)


# (id of a weight, layout) -> (packed copy, the weight's data_ptr and version when packed); an entry goes with its
# weight.  A weight changed in place is packed again, into the same memory, at its next call; CUDA graphs that
# replay calls without running them must be captured again after such a change (the streaming decoder does).
_packs: dict[tuple, tuple[torch.Tensor, int, int]] = {}


def _packed(weight: torch.Tensor, layout: tuple, pack: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    key = (id(weight), *layout)
    entry = _packs.get(key)
    if entry is not None and entry[1:] == (weight.data_ptr(), tensor_version(weight)):
        return entry[0]
    if entry is None:
        packed = pack(weight)
        weakref.finalize(weight, _packs.pop, key, None)
    else:
        packed = entry[0]
        packed.copy_(pack(weight))
    if packed.is_cuda and not torch.cuda.is_current_stream_capturing():
        # Calls on other CUDA streams (other streaming decoders) read it next: it must be written (once per weight).
        torch.cuda.current_stream(packed.device).synchronize()
    _packs[key] = (packed, weight.data_ptr(), tensor_version(weight))
    return packed


# ``scratch.kept[HANDOFF]``: the copy of its window that the caller's last ``sequence_tail(..., unfold=...)`` wrote in
# its launch, for the conv that reads the window next: (window, its version, the copy's layout, the copy).  The layout
# is ``_unfold``'s arguments after x (unfolded rows) or ("channels-last", dtype) for a tap-major conv.
HANDOFF = "handoff"


def _handed_off(x: torch.Tensor, layout: tuple, scratch: Scratch | None) -> torch.Tensor | None:
    """The copy of ``x`` in ``layout`` that its ``sequence_tail`` made, if it made that one."""
    handoff = None if scratch is None else scratch.kept.pop(HANDOFF, None)
    if handoff is not None:
        window, version, made, copy = handoff
        if window is x and version == tensor_version(x) and made == layout:
            return copy
    return None


def _unfolded(x: torch.Tensor, *layout, scratch: Scratch | None) -> torch.Tensor:
    """``_unfold(x, *layout)`` for a dense conv: the copy its ``sequence_tail`` made if it made one, else a new one."""
    cols = _handed_off(x, layout, scratch)
    return _unfold(x, *layout) if cols is None else cols


def _covered(layout: tuple, length: int) -> bool:
    """Whether every tap of every column of ``_unfold(x, *layout)`` reads a sample of ``x`` (``length`` samples):
    then storing each sample into the columns that read it writes every column once."""
    k, _, first, step, n_cols, _ = layout
    ends = (first, first + (k - 1) * step)
    return n_cols > 0 and min(ends) >= 0 and max(ends) + n_cols <= length


def _unfold_layout(unfold: tuple[int, ...], length: int, dtype: torch.dtype) -> tuple:
    """``_unfold``'s arguments after x for the call that ``sequence_tail``'s ``unfold`` hint names, on a window of
    ``length`` samples."""
    if len(unfold) == 2:  # conv1d(kernel, dilation), no padding
        k, dilation = unfold
        return k, triton.next_power_of_2(k), 0, dilation, length - (k - 1) * dilation, dtype
    k, stride, start, n = unfold  # conv_transpose1d: rows c mp + m hold input q - m, for the q of its outputs
    mp = triton.next_power_of_2(triton.cdiv(k, stride))
    return mp, mp, start // stride, -1, (start + n - 1) // stride - start // stride + 1, dtype


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    padding: int = 0,
    residual: torch.Tensor | None = None,
    residual_history: torch.Tensor | None = None,
    residual_offset: int = 0,
    tanh: bool = False,
    alpha: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.vocoder.conv1d` (the reference it is tested against; Snake bit for bit
    as :mod:`.snake` computes it)."""
    dtype = _compute(x, weight, dtype)
    if torch.float64 in (dtype, x.dtype, weight.dtype):
        return reference.conv1d(
            x, weight, bias, dilation=dilation, padding=padding, residual=residual,
            residual_history=residual_history, residual_offset=residual_offset, tanh=tanh, alpha=alpha,
            dtype=dtype,
        )  # fmt: skip
    c_out, c_in, k = weight.shape
    _check(x, None, c_in, "conv1d")
    if alpha is not None and alpha.numel() != c_out:
        raise ValueError(f"Snake after conv1d needs {c_out} alphas; got {alpha.numel()}")
    batch, n = x.shape[0], x.shape[-1]
    n_out = n + 2 * padding - (k - 1) * dilation
    if n_out < 0:
        raise ValueError(f"{n} samples are too few for a kernel spanning {(k - 1) * dilation + 1}")
    out = torch.empty(batch, c_out, n_out, dtype=dtype, device=x.device)
    if residual is not None:
        rh = _check(residual, residual_history, c_out, "the residual of conv1d")
        H_r = 0 if residual_history is None else residual_history.shape[-1]
        if residual_offset < 0 or residual_offset + n_out > H_r + residual.shape[-1]:
            raise ValueError(
                f"the residual has {H_r + residual.shape[-1] - residual_offset} samples from offset "
                f"{residual_offset}, not {n_out}"
            )
    else:
        residual, rh, H_r = out, out, 0
    if out.numel() == 0:
        return out
    if rh is out and _tap_major(c_in, k, dtype, x.device):
        return _conv_taps(x, weight, bias, alpha, out, padding, dilation, tanh, dtype, scratch)
    kp = triton.next_power_of_2(k)
    flat = _flat(batch, n_out)
    if flat:
        block_co, block_ci, block_t, warps = _flat_blocks(c_out, c_in, k, batch * n_out, x.device)
        grid = (triton.cdiv(batch * n_out, block_t), triton.cdiv(c_out, block_co), 1)
    else:
        block_co, block_ci, block_t, warps = _blocks(c_out, c_in, k, n_out, batch, 1, x.device)
        grid = (triton.cdiv(n_out, block_t), triton.cdiv(c_out, block_co), batch)
    b_ptr, s_b = _bias_args(bias, weight)
    n_groups, group = _groups(c_in, block_ci, kp)
    split = _split(n_groups, math.prod(grid), x.device)
    parts, counts = _split_buffers(math.prod(grid), n_groups, block_co, block_t, x, scratch) if split else (out, out)
    a = weight if alpha is None else alpha.reshape(c_out)
    if flat:
        dense = False
    elif k == 1:  # the input's rows are the reduction's rows: dense operands without an unfolded copy
        dense = padding == 0 and x.stride(-1) == 1
    else:
        dense = _dense(batch, c_in * kp, n_out, dtype)
    if dense:
        if k > 1:
            x = _unfolded(x, k, kp, -padding, dilation, n_out, dtype, scratch=scratch)
        w = _packed(weight, ("conv", dtype), lambda w: _pack_conv(w, kp, dtype))
        x_args, w_args = (x.stride(0), x.stride(1), 1), (w.stride(0), 0, 0)
    else:
        w, x_args, w_args = weight, x.stride(), weight.stride()
    _conv_kernel[(grid[0], grid[1], grid[2] * (n_groups if split else 1))](
        x, w, b_ptr, residual, rh, a, out, parts, counts,
        c_in, c_out, x.shape[-1] if dense else n, n_out, -padding, dilation, residual.shape[-1], H_r, residual_offset,
        n_groups, *x_args, *w_args, s_b, 0 if alpha is None else a.stride(0),
        *residual.stride(), *rh.stride(), *out.stride(), batch,
        K=k, KP=kp, BLOCK_CO=block_co, BLOCK_CI=block_ci, BLOCK_T=block_t,
        HAS_BIAS=bias is not None, HAS_RES=rh is not out, TANH=tanh, SNAKE=alpha is not None, GROUP=group,
        SPLIT=split, COMPUTE=_TL_DTYPES[dtype], PRECISION=_precision(dtype), DENSE=dense, STAGES=DENSE_STAGES,
        FLAT=flat, num_warps=warps,
        enable_fp_fusion=alpha is None,  # Snake rounded as torch rounds it; the other epilogues as measured
    )  # fmt: skip
    return out


def conv_transpose1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: int,
    start: int = 0,
    length: int | None = None,
    dtype: torch.dtype | None = None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.vocoder.conv_transpose1d` (the reference it is tested against)."""
    dtype = _compute(x, weight, dtype)
    if torch.float64 in (dtype, x.dtype, weight.dtype):
        return reference.conv_transpose1d(x, weight, bias, stride=stride, start=start, length=length, dtype=dtype)
    c_in, c_out, k = weight.shape
    _check(x, None, c_in, "conv_transpose1d")
    batch, n = x.shape[0], x.shape[-1]
    full = (n - 1) * stride + k
    length = full - start if length is None else length
    if start < 0 or length < 0 or start + length > full:
        raise ValueError(f"samples {start}..{start + length - 1} lie outside the {full} of the transposed conv")
    out = torch.empty(batch, c_out, length, dtype=dtype, device=x.device)
    if out.numel() == 0:
        return out
    mp = triton.next_power_of_2(triton.cdiv(k, stride))
    q_first = start // stride
    n_q = (start + length - 1) // stride - q_first + 1
    flat = _flat(batch, n_q)
    if flat:  # every phase of a channel in one program, as _transposed_blocks does for the DAC's strides
        phases = stride & -stride
        block_m, block_ci, block_q, warps = _flat_blocks(c_out * phases, c_in, mp, batch * n_q, x.device)
        block_co = max(1, block_m // phases)
        grid = (triton.cdiv(batch * n_q, block_q), triton.cdiv(c_out, block_co), stride // phases)
    else:
        block_co, phases, block_ci, block_q, warps = _transposed_blocks(c_out, c_in, mp, n_q, batch, stride, x.device)
        grid = (triton.cdiv(n_q, block_q), triton.cdiv(c_out, block_co), batch * (stride // phases))
    b_ptr, s_b = _bias_args(bias, weight)
    n_groups, group = _groups(c_in, block_ci, mp)
    split = _split(n_groups, math.prod(grid), x.device)
    parts, counts = (
        _split_buffers(math.prod(grid), n_groups, block_co * phases, block_q, x, scratch) if split else (out, out)
    )
    dense = not flat and _dense(batch, c_in * mp, n_q, dtype)
    if dense:  # rows c mp + m: input c at q - m, for every phase
        x = _unfolded(x, mp, mp, q_first, -1, n_q, dtype, scratch=scratch)
        x_args = (x.stride(0), x.stride(1), 1)
    else:
        x_args = x.stride()
    w = _packed(weight, ("transposed", stride, dtype), lambda w: _pack_transposed(w, stride, mp, dtype))
    _conv_transpose_kernel[(grid[0], grid[1], grid[2] * (n_groups if split else 1))](
        x, w, b_ptr, out, parts, counts,
        c_in, c_out, x.shape[-1] if dense else n, stride, start, length, q_first, n_q, n_groups,
        *x_args, w.stride(1), s_b, *out.stride(), batch,
        K=k, MP=mp, BLOCK_CO=block_co, PHASES=phases, BLOCK_CI=block_ci, BLOCK_Q=block_q,
        HAS_BIAS=bias is not None, GROUP=group, SPLIT=split, COMPUTE=_TL_DTYPES[dtype],
        PRECISION=_precision(dtype), DENSE=dense, STAGES=DENSE_STAGES, ALL_PHASES=phases == stride,
        FLAT=flat, num_warps=warps,
    )  # fmt: skip
    return out


def _tail_out(history: torch.Tensor, x: torch.Tensor, length: int, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` (a new tensor if None) after checking that it can hold the last ``length`` of ``[history | x]``."""
    if x.dim() != 3 or x.shape[:2] != history.shape[:2] or x.device != history.device:
        raise ValueError(f"history {tuple(history.shape)} does not continue x {tuple(x.shape)} on {x.device}")
    batch, channels, H = history.shape
    if not 0 <= length <= H + x.shape[-1]:
        raise ValueError(f"cannot keep {length} of {H + x.shape[-1]} samples")
    if out is None:
        return torch.empty(batch, channels, length, dtype=history.dtype, device=history.device)
    if out.shape != (batch, channels, length) or out.dtype != history.dtype or out.device != history.device:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} cannot hold the {length} last samples")
    return out


def sequence_tail(
    history: torch.Tensor,
    x: torch.Tensor,
    length: int,
    *,
    out: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    unfold: tuple[int, ...] | None = None,
    raw: tuple[torch.Tensor, int, torch.Tensor] | None = None,
    scratch: Scratch | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as :func:`zonos.ops.vocoder.sequence_tail` (Snake bit for bit as :mod:`.snake` computes it);
    ``out`` may be the leading samples of ``history``'s buffer (a stream layer's window updated in place).  With
    ``unfold`` it also writes, in the same launch, the unfolded input of the dense conv or transposed conv that
    reads the window next (:func:`conv1d` or :func:`conv_transpose1d` takes it over instead of unfolding the window
    itself: one launch less per layer; only with a ``scratch`` to hand it over in).  ``raw`` shares the launch too
    whenever it keeps the same samples of ``x`` as the window (a residual unit's raw inputs and its conv's window
    both keep all of a push's samples)."""
    if unfold is not None:
        reference.check_unfold(unfold)
    if history.dtype == torch.float64:
        return reference.sequence_tail(history, x, length, out=out, alpha=alpha, raw=raw, valid=valid)
    if valid is not None and (
        valid.shape != (x.shape[0], 2) or valid.dtype != torch.int64 or valid.device != x.device or valid.stride(1) != 1
    ):
        raise ValueError(f"valid must be ({x.shape[0]}, 2) int64 on {x.device}; got {tuple(valid.shape)} {valid.dtype}")
    out = _tail_out(history, x, length, out)
    batch, channels, H = history.shape
    n = x.shape[-1]
    if alpha is not None and alpha.numel() != channels:
        raise ValueError(f"Snake needs {channels} alphas; got {alpha.numel()}")
    if raw is not None:
        raw_history, raw_length, raw_out = raw
        raw_out = _tail_out(raw_history, x, raw_length, raw_out)
        if out.numel() == 0 or raw_out.numel() == 0 or min(raw_length, n) != min(length, n):
            sequence_tail(raw_history, x, raw_length, out=raw_out, scratch=scratch, valid=valid)
            raw = None
    if out.numel() == 0:
        return out
    n_h = max(H - (H + n - length), 0)
    if raw is None:  # the kernels' raw pointers are then unused
        raw_history, raw_out, raw_length = history, out, length - n_h
    H_r, n_hr = raw_history.shape[-1], raw_length - (length - n_h)  # n_hr: raw samples kept from raw_history
    a = history if alpha is None else alpha.reshape(channels)
    s_a = a.stride(0) if alpha is not None else 0
    block_h = max(16, triton.next_power_of_2(max(n_h, n_hr)))
    # The conv reading the window next is tap-major (it takes a channels-last copy) or dense (the unfolded rows).
    if scratch is None:
        unfold = None  # no caller's scratch to hand the conv its operands in
    channels_last = unfold is not None and len(unfold) == 2 and _tap_major(channels, unfold[0], out.dtype, out.device)
    layout = None if unfold is None or channels_last else _unfold_layout(unfold, length, out.dtype)
    if layout is not None and not (
        _covered(layout, length)
        and _dense(batch, channels * layout[1], layout[4], out.dtype)
        and not _flat(batch, layout[4])
    ):
        layout = None  # the conv unfolds the window itself
    k, kp, first, step, n_cols, _ = layout or (1, 1, 0, 0, 0, None)
    if channels_last:
        cols = torch.empty(batch, length, channels, dtype=out.dtype, device=out.device)
    elif layout is not None:
        cols = torch.empty(batch, channels * kp, _padded(n_cols), dtype=out.dtype, device=out.device)
    else:
        cols = out
    # Programs of a few thousand stores each (the taps' copies of a sample count too), square where the copy is
    # channels-last (its runs go along the channels, the window's along the samples).
    widest, stores, warps = CHANNELS_LAST_TILE if channels_last else WINDOW_TILE if cols is out else UNFOLD_WINDOW_TILE
    new = max(NARROWEST_WINDOW_BLOCK, triton.next_power_of_2(length - n_h))
    block_x = max(block_h, min(widest, new))  # >= n_h, n_hr
    block_c = max(1, min(triton.next_power_of_2(channels), stores // block_x))
    grid = (triton.cdiv(channels, block_c), max(1, triton.cdiv(length - n_h, block_x)), batch)
    _tail_kernel[grid](
        history, x, a, out, raw_history, raw_out, cols, x if valid is None else valid, channels, H, n, length, H_r,
        raw_length, s_a, n_cols, first, step, *history.stride(), *x.stride(), *out.stride(), *raw_history.stride(),
        *raw_out.stride(), *(cols.stride()[:2] if cols is not out else (0, 0)), 0 if valid is None else valid.stride(0),
        BLOCK_C=block_c, BLOCK_H=block_h, BLOCK_X=block_x, SNAKE=alpha is not None, RAW=raw is not None,
        K=k, KP=kp, UNFOLD=layout is not None, CHANNELS_LAST=channels_last, VALID=valid is not None, num_warps=warps,
        enable_fp_fusion=False,  # Snake rounded as torch rounds it
    )  # fmt: skip
    if channels_last:
        scratch.kept[HANDOFF] = (out, tensor_version(out), ("channels-last", out.dtype), cols)
    elif layout is not None:
        scratch.kept[HANDOFF] = (out, tensor_version(out), layout, cols)
    return out
