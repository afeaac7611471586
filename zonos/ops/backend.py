"""Backends: the set of op implementations one model runs.

A :class:`Backend` maps every op name of :mod:`zonos.ops` to a function. :data:`REFERENCE` holds the torch
references; an accelerator builds a new backend from another one with :meth:`Backend.replace` (e.g. the Triton
ops, then the CuTeDSL GEMV on top). A model owns its backend and hands it to its modules
(:func:`use_backend`), which call ``self.ops.<name>(...)``, so two models in one process can run different
backends, and switching one is a plain assignment that the next request sees. Backends compare by identity:
captured CUDA graphs are keyed by the backend object they replay.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from zonos.ops.activations import silu_mul
from zonos.ops.attention import decode_attention, prefill_attention
from zonos.ops.conv import causal_conv1d, conv_step
from zonos.ops.embedding import codebook_rows, embedding_sum
from zonos.ops.linear import linear
from zonos.ops.mamba_step import PARTS as STEP_TAIL_PARTS
from zonos.ops.mamba_step import compose_step_tail, mamba_step_tail
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


class Backend:
    """One implementation of every op in :data:`OP_NAMES`, as attributes (``backend.linear(x, w)``).

    ``name`` says what it is made of (e.g. ``"torch"``, ``"triton+cute_gemv"``); ``compute_dtype`` (not an op:
    the dtype the references compute in) is always the reference one.
    """

    compute_dtype = staticmethod(compute_dtype)

    def __init__(self, name: str, ops: dict[str, Callable]):
        missing = set(OP_NAMES) - set(ops)
        unknown = set(ops) - set(OP_NAMES)
        if missing or unknown:
            raise ValueError(f"a backend needs exactly the ops {list(OP_NAMES)}; missing {missing}, unknown {unknown}")
        self.name = name
        self._ops = dict(ops)
        for op, fn in ops.items():
            setattr(self, op, fn)

    def replace(self, name: str, **ops: Callable) -> Backend:
        """A new backend with some ops replaced (the others as in this one). ``mamba_step_tail``, unless given,
        is composed anew of the new backend's ``conv_step``, ``ssd_step`` and ``gated_rms_norm`` when any of
        those is replaced (so a backend with fast parts runs them inside the step tail too)."""
        unknown = set(ops) - set(OP_NAMES)
        if unknown:
            raise ValueError(f"unknown op(s) {sorted(unknown)}; known: {list(OP_NAMES)}")
        merged = {**self._ops, **ops}
        if "mamba_step_tail" not in ops and any(part in ops for part in STEP_TAIL_PARTS):
            merged["mamba_step_tail"] = compose_step_tail(*(merged[part] for part in STEP_TAIL_PARTS))
        return Backend(name, merged)

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
