"""How many kernels does one decode step launch, per op backend, counted without a GPU?

Builds the real Zonos-v0.1-hybrid layer structure (46 blocks: 34 Mamba2, 12 attention + MLP) at toy widths and runs
one backbone step and the heads (batch 1 with CFG: 2 rows) on the CPU with our Triton kernels in Triton's
interpreter, counting each Triton launch by kernel and each torch op outside them that launches a kernel on a GPU
(views, factories of empty tensors and dtype queries do not). The rotary kernel uses libdevice, which the
interpreter lacks: it runs the reference and counts as its one launch. cuBLAS's split-K reduction kernels and the
sampler (two launches with the fused sampler) are not in the count. The structure, not the widths, sets the count.

    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/step_launches.py      (from the repository root)
"""

from __future__ import annotations

import os
from collections import Counter

if os.environ.get("TRITON_INTERPRET") != "1":
    raise SystemExit("run it with TRITON_INTERPRET=1 (Triton's interpreter runs the kernels on the CPU)")

import torch  # noqa: E402
from gpu import report  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from tests.tiny import random_state_dict, real_config  # noqa: E402
from zonos.config import ZonosConfig  # noqa: E402
from zonos.model import Zonos  # noqa: E402
from zonos.ops.backend import REFERENCE  # noqa: E402
from zonos_accel.triton import DEFAULT_OPS, FUSED_BLOCK_OPS, fast_entry, gemv, mamba_block  # noqa: E402

NO_KERNEL = {"view", "_unsafe_view", "as_strided", "split", "split_with_sizes", "slice", "select", "unsqueeze",
             "squeeze", "t", "transpose", "permute", "expand", "alias", "detach", "reshape", "unflatten",
             "_reshape_alias", "chunk", "narrow", "unbind", "lift_fresh", "empty", "empty_like", "empty_strided",
             "promote_types", "result_type", "is_same_size", "sym_size", "sym_stride", "sym_numel"}  # fmt: skip
ONE_LAUNCH_ON_THE_GPU = ("rotate_and_cache",)  # fast paths the interpreter cannot run


class Counts(TorchDispatchMode):
    """Torch ops that launch kernels, outside Triton launches and one-launch stand-ins; and the Triton launches."""

    def __init__(self):
        super().__init__()
        self.torch: Counter = Counter()
        self.triton: Counter = Counter()
        self.quiet = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if not self.quiet and name not in NO_KERNEL:
            self.torch[name] += 1
        return func(*args, **(kwargs or {}))


def hybrid_at_toy_widths() -> Zonos:
    cfg = real_config("hybrid")
    bb = cfg["backbone"]
    bb.update(d_model=64, attn_mlp_d_intermediate=96)
    bb["attn_cfg"].update(num_heads=4, num_heads_kv=2, rotary_emb_dim=16)
    bb["ssm_cfg"].update(d_state=16, headdim=16, chunk_size=8)
    torch.manual_seed(0)
    model = Zonos(ZonosConfig.from_dict(cfg), max_seqlen=64)
    model.load_checkpoint(random_state_dict(model, 0), device="cpu", dtype=torch.float32)
    return model.eval()


def backend(name: str, names: tuple[str, ...], counts: Counts):
    def fast(op: str):
        if op in ONE_LAUNCH_ON_THE_GPU:
            reference = REFERENCE.op(op)

            def one_launch(*args, **kwargs):
                counts.triton[f"{op} (one launch on a GPU)"] += 1
                counts.quiet += 1
                try:
                    return reference(*args, **kwargs)
                finally:
                    counts.quiet -= 1

            return one_launch
        return fast_entry(op)

    return REFERENCE.replace(name, **{op: fast(op) for op in names if op != "ssd_scan"})  # prefill only


def main() -> None:
    model = hybrid_at_toy_widths()
    counts = Counts()
    launch = interpreter.GridExecutor.__call__

    def counted(executor, *args, **kwargs):
        counts.triton[executor.fn.__name__] += 1
        counts.quiet += 1
        try:
            return launch(executor, *args, **kwargs)
        finally:
            counts.quiet -= 1

    interpreter.GridExecutor.__call__ = counted
    saved = mamba_block.SSM_IN_PROJ, gemv.TILE_ELEMENTS
    rows = []
    try:
        fused = DEFAULT_OPS + FUSED_BLOCK_OPS
        cases = [("triton (op by op)", DEFAULT_OPS, False), ("triton + fused_blocks", fused, False),
                 ("triton + fused_blocks, SSM_IN_PROJ", fused, True)]  # fmt: skip
        # GEMV tiles of 4 channels, as at real size (8192 elements over d_model 2048): the state update fits in
        # in_proj's launch only when a head's channels fill whole tiles
        gemv.TILE_ELEMENTS = 4 * model.config.backbone.d_model
        for name, names, ssm_in_proj in cases:
            mamba_block.SSM_IN_PROJ = ssm_in_proj
            model.set_backend(backend(name, names, counts))
            state = model.backbone.allocate_inference_state(2, 64)
            state.position.fill_(10)
            hidden = torch.randn(2, 1, model.config.backbone.d_model)
            with torch.no_grad():
                model.backbone.step(hidden, state)  # first calls outside the count
                counts.torch.clear()
                counts.triton.clear()
                with counts:
                    model.apply_heads(model.backbone.step(hidden, state)[:, 0])
            total = sum(counts.triton.values()) + sum(counts.torch.values())
            detail = ", ".join(f"{k} {v}" for k, v in (counts.triton + counts.torch).most_common())
            rows.append([name, sum(counts.triton.values()), sum(counts.torch.values()), total, detail])
    finally:
        interpreter.GridExecutor.__call__ = launch
        mamba_block.SSM_IN_PROJ, gemv.TILE_ELEMENTS = saved
    header = ["backend", "Triton launches", "torch kernels", "total", "by kernel"]
    title = "one decode step's kernels (backbone step + heads, 2 rows; sampler and split-K reductions not counted)"
    print(report(title, header, rows))


if __name__ == "__main__":
    main()
