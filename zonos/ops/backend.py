"""Backends: the set of op implementations one model runs.

A :class:`Backend` maps every op name of :mod:`zonos.ops` to a function. :data:`REFERENCE` holds the torch
references; an accelerator builds a new backend from another one with :meth:`Backend.replace` (e.g. the Triton
ops, then the CuTeDSL GEMV on top). A model owns its backend and hands it to its modules
(:func:`use_backend`), which call ``self.ops.<name>(...)``, so two models in one process can run different
backends, and switching one is a plain assignment that the next request sees. Backends compare by identity:
captured CUDA graphs are keyed by the backend object they replay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from zonos.ops.activations import silu_mul
from zonos.ops.attention import decode_attention, prefill_attention
from zonos.ops.conv import causal_conv1d, conv_step
from zonos.ops.embedding import codebook_rows, embedding_sum
from zonos.ops.linear import linear
from zonos.ops.mamba_step import (
    BLOCK_PARTS,
    PARTS,
    compose_block_step,
    compose_step_tail,
    mamba_block_step,
    mamba_step_tail,
)
from zonos.ops.norm_linear import (
    NORM_GLU_PARTS,
    NORM_LINEAR_PARTS,
    add_layer_norm_glu,
    add_layer_norm_linear,
    compose_norm_glu,
    compose_norm_linear,
)
from zonos.ops.norms import add_layer_norm, gated_rms_norm
from zonos.ops.precision import compute_dtype
from zonos.ops.rotary import rotate_and_cache
from zonos.ops.sampler import finish_rows, sample_rows
from zonos.ops.snake import snake
from zonos.ops.ssd import ssd_scan, ssd_step
from zonos.ops.vocoder import conv1d, conv_transpose1d, sequence_tail

_REFERENCE_OPS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        add_layer_norm,
        add_layer_norm_glu,
        add_layer_norm_linear,
        causal_conv1d,
        codebook_rows,
        conv1d,
        conv_step,
        conv_transpose1d,
        decode_attention,
        embedding_sum,
        finish_rows,
        gated_rms_norm,
        linear,
        mamba_block_step,
        mamba_step_tail,
        prefill_attention,
        rotate_and_cache,
        sample_rows,
        sequence_tail,
        silu_mul,
        snake,
        ssd_scan,
        ssd_step,
    )
}
OP_NAMES = tuple(sorted(_REFERENCE_OPS))
# Composite ops: name -> (the ops it is made of, the function composing them), parts before the ops made of them.
COMPOSITES: dict[str, tuple[tuple[str, ...], Callable]] = {
    "mamba_step_tail": (PARTS, compose_step_tail),
    "mamba_block_step": (BLOCK_PARTS, compose_block_step),
    "add_layer_norm_linear": (NORM_LINEAR_PARTS, compose_norm_linear),
    "add_layer_norm_glu": (NORM_GLU_PARTS, compose_norm_glu),
}


@dataclass(frozen=True)
class Fused:
    """A fused kernel for a composite op, serving the calls ``fits`` accepts (same arguments as the op); the backend
    runs the composition of its own parts for the rest (e.g. batches too large for a GEMV), so later replacements
    of a part still reach them."""

    fast: Callable
    fits: Callable[..., bool]


def _serve(fused: Fused, composed: Callable) -> Callable:
    @functools.wraps(composed)
    def op(*args, **kwargs):
        if fused.fits(*args, **kwargs):
            return fused.fast(*args, **kwargs)
        return composed(*args, **kwargs)

    op.fused = fused
    return op


class Backend:
    """One implementation of every op in :data:`OP_NAMES`, as attributes (``backend.linear(x, w)``).

    ``name`` says what it is made of (e.g. ``"torch"``, ``"triton+cute_gemv"``); ``compute_dtype`` (not an op:
    the dtype the references compute in) is always the reference one.
    """

    compute_dtype = staticmethod(compute_dtype)

    def __init__(
        self,
        name: str,
        ops: dict[str, Callable],
        composed: frozenset[str] = frozenset(COMPOSITES),
        fused: dict[str, Fused] | None = None,
    ):
        """``ops``: every op's function; ``composed``: the composite ops (:data:`COMPOSITES`) to build of their
        parts in ``ops`` (their entries there are ignored), each served by its :class:`Fused` kernel in ``fused``
        where it fits."""
        missing = set(OP_NAMES) - set(ops)
        unknown = set(ops) - set(OP_NAMES)
        if missing or unknown:
            raise ValueError(f"a backend needs exactly the ops {list(OP_NAMES)}; missing {missing}, unknown {unknown}")
        self.name = name
        self._ops = dict(ops)
        self._composed = frozenset(composed)
        self._fused = dict(fused or {})
        for op, (parts, compose) in COMPOSITES.items():
            if op in self._composed:
                self._ops[op] = compose(*(self._ops[part] for part in parts))
                if op in self._fused:
                    self._ops[op] = _serve(self._fused[op], self._ops[op])
        for op, fn in self._ops.items():
            setattr(self, op, fn)

    def replace(self, name: str, **ops: Callable | Fused) -> Backend:
        """A new backend with some ops replaced (the others as in this one). A composite op (:data:`COMPOSITES`)
        given as a function is that function from then on; given as a :class:`Fused`, it runs that kernel where it
        fits; otherwise it is composed anew of the new backend's parts (so a backend with fast parts runs them
        inside the composite too)."""
        unknown = set(ops) - set(OP_NAMES)
        if unknown:
            raise ValueError(f"unknown op(s) {sorted(unknown)}; known: {list(OP_NAMES)}")
        plain = {op: fn for op, fn in ops.items() if not isinstance(fn, Fused)}
        fused = {op: fn for op, fn in ops.items() if isinstance(fn, Fused)}
        if set(fused) - set(COMPOSITES):
            raise ValueError(f"only composite ops ({list(COMPOSITES)}) take a Fused kernel, not {sorted(fused)}")
        kept = {op: f for op, f in self._fused.items() if op not in plain}
        return Backend(name, {**self._ops, **plain}, self._composed - set(plain), {**kept, **fused})

    def op(self, name: str) -> Callable:
        """The function behind op ``name``."""
        return self._ops[name]

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


REFERENCE = Backend("torch", _REFERENCE_OPS)


class UsesOps:
    """Mixin for modules that call ops: ``self.ops`` is the reference backend until :func:`use_backend` sets
    another on the module tree."""

    ops: Backend = REFERENCE


def use_backend(module: nn.Module, backend: Backend) -> None:
    """Make every module in ``module``'s tree that calls ops (a :class:`UsesOps`) run ``backend``."""
    for m in module.modules():
        if isinstance(m, UsesOps):
            m.ops = backend
