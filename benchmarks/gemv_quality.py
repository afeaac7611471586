"""Quality of ``use_cute_gemv`` at real size: a teacher-forced probe and the per-op error.

Teacher-forced probe: one fixed random sequence of ``--steps`` delayed code columns (seeded; the delay
pattern of random frames, column 0 all MASK, as the decode loop starts) is forced through
Zonos-v0.1-hybrid with random bf16 weights (``benchmarks/common.py: random_model``) after a random
(2, 120, 2048) prefix, batch 1 with CFG (backbone batch 2, so the decode projections are M = 2). Every arm
runs the backbone prefill and then decode steps (``guided_logits`` after each) on the same column at every step
whatever it predicts (no sampling), on a freshly allocated inference state, eagerly (CUDA graphs off: a replay runs the
same kernels, so the same numbers), with the same op backend (``--ops``, default the Triton fast paths).
Arms: cuBLAS (flag off), the CuTeDSL GEMV (``use_accelerators(use_cute_gemv=True)``; prefill stays on cuBLAS
except the heads' M = 2 product of the last position), cuBLAS again after it (run-to-run noise and that
switching back restores the path), and the same weights in float32 with the torch ops (the reference the
two bf16 paths are both rounded away from). All bf16 arms use one model, so their weights are identical.

For each pair of arms it reports, per codebook, the steps whose argmax of the guided logits differ (token
flips), the relative difference of the logits per step (‖a − b‖ / ‖b‖ over the finite entries, the max over
the 9 codebooks, then its median, p90 and max over steps), and the reference arm's top-1 − top-2 logit gap
at the flips against all steps (flips at near-ties are rounding; flips at wide gaps would be a bug). A
second table splits flips and differences by step range (does the recurrent state drift apart?).

Per-op error: for every decode projection shape of the model (Mamba2 in/out, attention qkv/out, MLP
fc1/fc2, the 9 heads fused), the model's own weight times a random x of M ∈ {1, 2, 4} rows, against
float64: the GEMV, cuBLAS (``F.linear``), and the float64 result rounded to bf16 (the least any bf16
output can have). Outputs are poisoned with NaN before the GEMV writes them. Per-op error is the gate;
flips are reported, not gated. Random weights make near-ties likelier than a trained model's peaked
logits, so the flip counts are an upper-side estimate.

    source .device/activate.sh && python3 benchmarks/gemv_quality.py [--steps 200] [--ops triton]

CPU smoke test of the plumbing (tiny hybrid from tests/tiny.py, fp32, the flag off in both arms, so
0 flips and 0 difference are expected; the per-op "ours" column is the reference linear):

    PYTHONPATH=. .venv/bin/python benchmarks/gemv_quality.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F
from common import percentile, random_model
from gpu import report, tiny_model

from zonos.backbone.attention import Attention
from zonos.codebook_pattern import apply_delay_pattern
from zonos.model import CODEBOOK_SIZE, N_CODEBOOKS


@torch.inference_mode()
def teacher_forced(model, prefix: torch.Tensor, delayed: torch.Tensor, steps: int, cfg_scale: float) -> torch.Tensor:
    """Guided logits (steps, 9, V) of prefill (column 0) and ``steps - 1`` decode steps, step t fed column t of
    ``delayed`` (one sequence) whatever the model predicted. ``prefix`` is one (cond, uncond) pair, or the cond row
    alone with guidance off (it then runs twice: ``guided_logits`` takes row pairs)."""
    prefix = prefix.to(model.dtype)
    if prefix.shape[0] == 1:
        prefix = prefix.expand(2, -1, -1)
    state = model.backbone.allocate_inference_state(2, model.max_seqlen)  # fresh caches for every arm
    cfg = torch.full((1,), float(cfg_scale), device=prefix.device)
    hidden = torch.cat([prefix, model.embed_codes(delayed[..., :1]).expand(2, -1, -1)], dim=1)
    out = [model.guided_logits(model.backbone(hidden, state)[:, -1], cfg)]
    for t in range(1, steps):
        column = model.embed_codes(delayed[..., t : t + 1]).expand(2, -1, -1)
        out.append(model.guided_logits(model.backbone.step(column, state)[:, -1], cfg))
    return torch.cat(out).float()


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per (step, codebook): argmax flips, relative logit difference, and b's top-1 − top-2 gap."""
    finite = torch.isfinite(a) & torch.isfinite(b)
    a64, b64 = a.double().where(finite, 0.0), b.double().where(finite, 0.0)
    rel = (a64 - b64).norm(dim=-1) / b64.norm(dim=-1).clamp_min(1e-30)
    top2 = b.topk(2, dim=-1).values
    return {"flips": a.argmax(-1) != b.argmax(-1), "rel": rel, "gap": (top2[..., 0] - top2[..., 1]).double()}


def probe_row(label: str, c: dict[str, torch.Tensor]) -> list:
    flips, step_rel = c["flips"], c["rel"].max(dim=-1).values.tolist()
    total = int(flips.sum())
    gaps_at = c["gap"][flips]
    return [
        label,
        *[int(n) for n in flips.sum(dim=0)],
        total,
        f"{100 * total / flips.numel():.2f}",
        f"{percentile(step_rel, 50):.2e}",
        f"{percentile(step_rel, 90):.2e}",
        f"{max(step_rel):.2e}",
        f"{gaps_at.median().item():.3f}" if total else "-",
        f"{c['gap'].median().item():.3f}",
    ]


def projections(model) -> dict[str, torch.Tensor]:
    """One weight per decode projection shape: Mamba2 in/out, attention qkv/out, MLP fc1/fc2, the fused heads."""
    found: dict[str, torch.Tensor] = {}
    for layer in model.backbone.layers:
        kind = "attn" if isinstance(layer.mixer, Attention) else "mamba"
        found.setdefault(f"{kind} in_proj", layer.mixer.in_proj.weight)
        found.setdefault(f"{kind} out_proj", layer.mixer.out_proj.weight)
        if layer.mlp is not None:
            found.setdefault("mlp fc1", layer.mlp.fc1.weight)
            found.setdefault("mlp fc2", layer.mlp.fc2.weight)
    found["heads (9 fused)"] = model.heads_weight
    return found


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(y).all():
        return float("inf")
    return ((y.double() - ref).norm() / ref.norm()).item()


@torch.inference_mode()
def per_op_rows(model, ours, seed: int) -> list[list]:
    """Relative error against float64 of ``ours(x, w, out)`` and ``F.linear`` at each projection and M."""
    gen = torch.Generator(model.device).manual_seed(seed)
    rows = []
    for name, w in projections(model).items():
        n, k = w.shape
        for m in (1, 2, 4):
            x = torch.randn(m, k, device=model.device, generator=gen).to(w.dtype)
            ref = x.double() @ w.double().T
            out = torch.full((m, n), float("nan"), device=w.device, dtype=w.dtype)
            e_ours, e_cublas = rel_err(ours(x, w, out), ref), rel_err(F.linear(x, w), ref)
            ideal = rel_err(ref.to(w.dtype), ref)
            ratio = f"{e_ours / e_cublas:.3f}" if e_cublas else "-"
            rows.append([name, f"{n}×{k}", m, f"{e_ours:.3e}", f"{e_cublas:.3e}", f"{ideal:.3e}", ratio])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny hybrid, fp32, flag off in both arms (smoke test)")
    ap.add_argument("--steps", type=int, default=200, help="teacher-forced columns (prefill + steps - 1 decode steps)")
    ap.add_argument("--prefix", type=int, default=120)
    ap.add_argument("--cfg-scale", type=float, default=2.0)
    ap.add_argument("--ops", choices=("triton", "torch"), default="triton", help="op backend of the bf16 arms")
    ap.add_argument("--bucket", type=int, default=20, help="steps per row of the by-step table")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-reference", action="store_true", help="skip the float32 arm")
    args = ap.parse_args()
    smoke = args.tiny
    on_cuda = args.device.startswith("cuda")
    start = time.perf_counter()

    max_seqlen = args.prefix + args.steps + N_CODEBOOKS + 16
    torch.manual_seed(args.seed)
    if smoke:
        model = tiny_model(max_seqlen, seed=args.seed).to(args.device)
    else:
        model = random_model("hybrid", device=args.device, max_seqlen=max_seqlen)
    if on_cuda:
        from gpu import environment

        print(environment())
    else:
        print(f"{args.device} | torch {torch.__version__}")
    reference = None
    if not args.no_reference:
        with torch.inference_mode(False):  # parameters are copied as ordinary tensors
            reference = copy.deepcopy(model).float()

    gen = torch.Generator(args.device).manual_seed(args.seed + 1)
    d = model.config.backbone.d_model
    prefix = torch.randn(2, args.prefix, d, device=args.device, generator=gen).to(model.dtype)
    if args.cfg_scale == 1.0:
        prefix = prefix[:1]  # guidance off: the conditional half only (backbone batch 1, M = 1)
    frames = torch.randint(0, CODEBOOK_SIZE, (1, N_CODEBOOKS, args.steps), device=args.device, generator=gen)
    delayed = apply_delay_pattern(frames, model.masked_token_id)

    fast = on_cuda and args.ops == "triton"
    gemv_on = not smoke  # the smoke test runs the flag off in both arms
    arms = {
        "base": (model, dict(fast_ops=fast, use_cute_gemv=False)),
        "gemv": (model, dict(fast_ops=fast, use_cute_gemv=gemv_on)),
        "base2": (model, dict(fast_ops=fast, use_cute_gemv=False)),
    }
    if reference is not None:
        arms["fp32"] = (reference, dict(fast_ops=False, use_cute_gemv=False))
    logits = {}
    for name, (m, flags) in arms.items():
        t0 = time.perf_counter()
        m.use_accelerators(cuda_graphs=False, **flags)
        logits[name] = teacher_forced(m, prefix, delayed, args.steps, args.cfg_scale)
        if on_cuda:
            torch.cuda.synchronize()
        print(f"arm {name} ({flags}): {time.perf_counter() - t0:.1f} s", flush=True)
    model.use_accelerators(cuda_graphs=False, fast_ops=fast, use_cute_gemv=False)

    gemv_label = "B" if smoke else "GEMV"
    base_label = "A" if smoke else "cuBLAS"
    pairs = {
        f"{gemv_label} vs {base_label}": ("gemv", "base"),
        f"{base_label} rerun vs {base_label}": ("base2", "base"),
    }
    if reference is not None:
        pairs[f"{base_label} vs fp32"] = ("base", "fp32")
        pairs[f"{gemv_label} vs fp32"] = ("gemv", "fp32")
    results = {label: compare(logits[a], logits[b]) for label, (a, b) in pairs.items()}

    dtype = "fp32" if smoke else "bf16"
    what = "tiny hybrid" if smoke else "Zonos-v0.1-hybrid"
    title = (
        f"Teacher-forced probe: {what} random {dtype}, {args.ops if on_cuda else 'torch'} ops, prefix "
        f"{args.prefix}, CFG {args.cfg_scale}, {args.steps} steps × 9 codebooks; argmax flips per codebook"
    )
    header = [
        "comparison",
        *[f"cb{k}" for k in range(N_CODEBOOKS)],
        "flips",
        "% of argmaxes",
        "step rel diff p50",
        "p90",
        "max",
        "ref top1−top2 gap p50 at flips",
        "gap p50 all",
    ]
    print(report(title, header, [probe_row(label, c) for label, c in results.items()]))
    if smoke:
        print(
            "A, B: two arms with the flag off (smoke test); A rerun: A again after B; fp32: the same weights in fp32."
        )
    else:
        print(
            "GEMV: use_cute_gemv=True; cuBLAS: the flag off; cuBLAS rerun: the flag off again after the GEMV arm; "
            "fp32 weights: the bf16 weights in float32 with the torch ops. Gap: the second arm's top-1 − top-2 logit."
        )

    by_step = []
    labels = list(results)
    for s in range(0, args.steps, args.bucket):
        e = min(s + args.bucket, args.steps)
        row = [f"{s}–{e - 1}"]
        for label in labels:
            c = results[label]
            row += [int(c["flips"][s:e].sum()), f"{c['rel'][s:e].max().item():.2e}"]
        by_step.append(row)
    header = ["steps"] + [f"{h} {label}" for label in labels for h in ("flips", "max rel diff")]
    print(report(f"By step (step 0 is the prefill's logits), {args.bucket} steps per row", header, by_step))

    if smoke:

        def ours(x, w, out):
            return out.copy_(torch.nn.functional.linear(x, w))

        ours_label = "reference linear (smoke)"
    else:
        from zonos_accel.gemv import gemv

        def ours(x, w, out):
            return gemv(x, w, out=out)

        ours_label = "CuTe GEMV"
    header = ["projection", "N×K", "M", f"rel err {ours_label}", "rel err F.linear", "float64 → dtype", "ratio"]
    title = f"Per-op relative error against float64 ({what} weights, {dtype}, random x)"
    print(report(title, header, per_op_rows(model, ours, args.seed + 2)))
    print(f"total {time.perf_counter() - start:.0f} s")

    if smoke:
        c = results[f"{gemv_label} vs {base_label}"]
        ok = not c["flips"].any() and c["rel"].max().item() == 0.0
        print("smoke: the two flag-off arms agree exactly" if ok else "smoke: FAILED, the flag-off arms differ")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
