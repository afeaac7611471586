"""Op boundary of the model: the pure-PyTorch reference of every op the backbone calls.

Each function here is the specification a fast path (Triton, CuTeDSL) must equal; the tests compare
fast paths against these on fresh random inputs.
"""

from zonos.ops.activations import silu_mul
from zonos.ops.attention import decode_attention, prefill_attention
from zonos.ops.conv import causal_conv1d, conv_step
from zonos.ops.embedding import codebook_rows, embedding_sum
from zonos.ops.linear import linear
from zonos.ops.mamba_step import mamba_block_step, mamba_step_tail
from zonos.ops.norm_linear import add_layer_norm_glu, add_layer_norm_linear
from zonos.ops.norms import add_layer_norm, gated_rms_norm
from zonos.ops.precision import compute_dtype
from zonos.ops.rotary import apply_rotary, rotary_cos_sin, rotary_qk, rotate_and_cache
from zonos.ops.sampler import finish_rows, sample_rows
from zonos.ops.snake import snake
from zonos.ops.ssd import ssd_scan, ssd_step
from zonos.ops.vocoder import conv1d, conv_transpose1d, sequence_tail

__all__ = [
    "add_layer_norm",
    "add_layer_norm_glu",
    "add_layer_norm_linear",
    "apply_rotary",
    "causal_conv1d",
    "codebook_rows",
    "compute_dtype",
    "conv1d",
    "conv_step",
    "conv_transpose1d",
    "decode_attention",
    "embedding_sum",
    "finish_rows",
    "gated_rms_norm",
    "linear",
    "mamba_block_step",
    "mamba_step_tail",
    "prefill_attention",
    "rotary_cos_sin",
    "rotary_qk",
    "rotate_and_cache",
    "sample_rows",
    "sequence_tail",
    "silu_mul",
    "snake",
    "ssd_scan",
    "ssd_step",
]
