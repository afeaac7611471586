"""First request in a fresh process: time from process start to model ready and to the first frame, with
cold and warm kernel caches.

The parent launches one child process per case and reads back its timestamps (``time.perf_counter``, which
is CLOCK_MONOTONIC on Linux, so the parent's spawn time and the child's stamps share one clock). A child:

1. imports torch, zonos and the accelerator packages (zonos_accel.graphs, zonos_accel.triton → triton; with
   ``--cute-gemv`` also the CuTeDSL kernel module);
2. builds the model: real-size Zonos-v0.1-hybrid with random bf16 weights (``benchmarks/common.py:
   random_model``; with ``--checkpoint DIR`` or ``--write-checkpoint`` read from a real-size checkpoint file by
   ``Zonos.from_local`` instead, with its default accelerators), a
   random real-size DAC 44.1 kHz codec, then for random weights ``model.use_accelerators()`` as ``from_local``
   does (Triton fast ops, the CuTeDSL scan and CUDA graphs on), synchronized: "model ready";
3. runs two streamed requests (``generate(..., stream=True)``, batch 1 with CFG, a random (2, 120, 2048)
   prefix in place of text conditioning, so no espeak; EOS barred by a logits processor) and stops each at its
   first audio chunk, stamping prefill done, first decode step (device synchronized at both) and the first
   chunk with audio.

The child also times each Triton compile (between Triton's ``jit_cache_hook`` and ``jit_post_compile_hook``: a
compile, or a load from the disk cache when warm; an autotuner compiles every config it benchmarks), and the
parent prints the kernels that took longest, per case.

Cases (``--cases``): ``cold`` runs with empty TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
CUTE_DSL_CACHE_DIR in a temporary directory; ``warm`` is a second process on the same directories (primed
by an unreported child first if ``cold`` did not run); ``cold-warmup`` runs ``model.warmup()`` (for the
requests' prompt length and settings, its compile-ahead pass on) before the requests, on empty directories of
its own, as a server's start does. zonos_accel keeps mamba_ssm's Triton autotuning
results in that cache too (``zonos_accel.triton.mamba``), so a warm process neither compiles nor tunes.

The issue's targets (issue 36): model ready ≤ 5 s after spawn; first audio ≤ 15 s after the model is ready with
empty caches (a server's start: ``cold-warmup``), ≤ 1.5 s with warm ones.

    source .device/activate.sh && python3 benchmarks/first_request.py

CPU smoke test of the plumbing (tiny hybrid from tests/tiny.py, fp32, accelerators off):

    PYTHONPATH=. .venv/bin/python benchmarks/first_request.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T_START = time.perf_counter()  # the child's first stamp: interpreter up, stdlib imported

ROOT = Path(__file__).resolve().parent.parent
SPAWN_ENV = "ZONOS_FIRST_REQUEST_SPAWN"
RESULT_TAG = "FIRST_REQUEST_RESULT "
# case → (cache group, empty the group's directories first, extra environment)
WARMUP_ENV = "ZONOS_FIRST_REQUEST_WARMUP"
CASES = {
    "cold": ("plain", True, {}),
    "warm": ("plain", False, {}),
    # model.warmup() first (its compile-ahead pass on), then the requests: what a server's start pays
    "cold-warmup": ("warmup", True, {WARMUP_ENV: "1"}),
    # the same with the compiles in a process per core (Zonos.warmup's compile_processes)
    "cold-warmup-processes": ("warmup", True, {WARMUP_ENV: "processes"}),
}
# issue 36: (case, column, at most s)
TARGETS = (
    ("cold-warmup", "model ready → first audio s", 15.0),
    ("warm", "model ready → first audio s", 1.5),
    ("warm", "spawn → model ready s", 5.0),
)


# ------------------------------------------------------------------------------------------------- child


def child(args: argparse.Namespace) -> None:
    stamps = {"spawn": float(os.environ.get(SPAWN_ENV, T_START)), "start": T_START}
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    stamps["torch"] = time.perf_counter()
    from common import random_model
    from gpu import tiny_model

    from zonos.codec.autoencoder import DACAutoencoder
    from zonos.codec.dac import DACConfig
    from zonos.model import Zonos  # import cost belongs to "imports"

    accel = not args.tiny and args.device.startswith("cuda")
    stamps["zonos"] = time.perf_counter()
    if accel:
        import zonos_accel.graphs  # noqa: F401
        import zonos_accel.triton  # noqa: F401  (triton, mamba_ssm)

        if args.cute_gemv:
            import zonos_accel.gemv.kernel  # noqa: F401  (cutlass)
    stamps["imports"] = time.perf_counter()
    compiles = CompileLog() if accel else None

    def sync() -> None:
        if accel:
            torch.cuda.synchronize()

    torch.manual_seed(0)
    if args.tiny:
        codec = DACAutoencoder(DACConfig(encoder_hidden_size=4, decoder_hidden_size=32, hidden_size=64))
        model = tiny_model(args.max_seqlen, autoencoder=codec)
        dtype = torch.float32
    else:
        codec = DACAutoencoder(DACConfig(), device=args.device)
        sync()
        stamps["codec"] = time.perf_counter()
        if args.checkpoint:  # read as a downloaded checkpoint is, with from_local's accelerators (and overlaps)
            files = (Path(args.checkpoint) / "config.json", Path(args.checkpoint) / "model.safetensors")
            model = Zonos.from_local(
                *files, device=args.device, autoencoder=codec, max_seqlen=args.max_seqlen,
                use_cute_gemv=args.cute_gemv, use_cute_scan=args.cute_scan or None,
            )  # fmt: skip
        else:
            model = random_model("hybrid", device=args.device, autoencoder=codec, max_seqlen=args.max_seqlen)
        dtype = torch.bfloat16
    sync()
    stamps["model"] = time.perf_counter()
    if accel and not args.checkpoint:
        # what from_local does (defaults: all on)
        model.use_accelerators(use_cute_gemv=args.cute_gemv or None, use_cute_scan=args.cute_scan or None)
    elif not accel:
        model.use_accelerators(fast_ops=False, cuda_graphs=False, use_cute_gemv=False)
    sync()
    stamps["ready"] = time.perf_counter()
    dynamo = ["torch._dynamo" in sys.modules]  # an op on a meta tensor imports it (seconds): at ready, at the end
    if os.environ.get(WARMUP_ENV) and accel:
        from zonos_accel.compile_ahead import default_workers

        processes = default_workers() if os.environ[WARMUP_ENV] == "processes" else 0
        model.warmup(prefix_length=args.prefix, frames=args.frames, cfg_scale=args.cfg_scale, progress_bar=False,
                     compile_processes=processes)  # fmt: skip
        sync()
    stamps["warmed"] = time.perf_counter()

    d = model.config.backbone.d_model
    gen = torch.Generator(args.device).manual_seed(1)
    prefix = torch.randn(2, args.prefix, d, device=args.device, generator=gen).to(dtype)
    requests = []
    stamper = PrefillStamp(model.eos_token_id, sync)
    for i in range(2):
        requests.append(request(model, prefix, args, seed=i, sync=sync, stamper=stamper))
        graphs = model.engine.graphs
        requests[-1]["captures"] = None if graphs is None else graphs.captures
    dynamo.append("torch._dynamo" in sys.modules)
    result = {"stamps": stamps, "requests": requests, "env": environment(torch, args.device), "dynamo": dynamo}
    result["compiles"] = {} if compiles is None else compiles.by_kernel
    result["constexprs"] = {} if compiles is None else compiles.constexprs
    print(RESULT_TAG + json.dumps(result), flush=True)


class CompileLog:
    """Seconds and count of Triton compiles per kernel name in this process (from Triton's JIT hooks)."""

    def __init__(self):
        import threading

        from triton import knobs

        self.by_kernel: dict[str, list] = {}  # name -> [compiles, seconds]
        # name -> the constexpr values of each compile: which ones vary tells what multiplies the specializations
        self.constexprs: dict[str, list[dict[str, str]]] = {}
        self._started: dict[int, float] = {}
        self._thread = threading.get_ident

        def started(*, fn, compile, **kwargs):
            self._started[self._thread()] = time.perf_counter()
            names = fn.jit_function.arg_names
            values = {names[path[0]]: repr(v) for path, v in compile["constants"].items()}
            self.constexprs.setdefault(fn.name, []).append(values)
            return None  # compile as usual

        def finished(*, fn, **kwargs):
            t0 = self._started.pop(self._thread(), None)
            if t0 is not None:
                entry = self.by_kernel.setdefault(fn.name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - t0

        knobs.runtime.jit_cache_hook = started
        knobs.runtime.jit_post_compile_hook = finished


class PrefillStamp:
    """The requests' logits processor: bars EOS from codebook 0 (every run lasts its length), and on its first call
    after :meth:`arm` (a request's prefill, which the engine runs eagerly before the request's first decode step)
    synchronizes the device and stamps the time. Disarmed, it is tensor work only, so the decode step's CUDA graph
    captures and replays it like any processor; one object serves every request, so they share one step graph."""

    def __init__(self, eos_token_id: int, sync):
        self.eos_token_id = eos_token_id
        self.sync = sync
        self.marks: dict[str, float] | None = None

    def arm(self, marks: dict[str, float]) -> None:
        self.marks = marks

    def __call__(self, logits, step):
        if self.marks is not None:
            self.sync()
            self.marks["prefill"] = time.perf_counter()
            self.marks = None
        out = logits.clone()
        out[:, 0, self.eos_token_id] = float("-inf")
        return out


def request(model, prefix, args: argparse.Namespace, seed: int, sync, stamper: PrefillStamp) -> dict:
    """One streamed request, stopped at its first chunk with audio: perf_counter stamps of the call, the end of
    prefill and of the first decode step (device synchronized there) and the first audio chunk."""
    import torch

    marks: dict[str, float] = {}

    def callback(frame, step, max_steps):  # on the engine's thread, after each decode step
        if step == 1:
            sync()
            marks["step"] = time.perf_counter()
        return True

    generator = torch.Generator(args.device).manual_seed(seed)
    stamper.arm(marks)
    sync()
    marks["call"] = time.perf_counter()
    stream = model.generate(
        prefix,
        max_new_tokens=args.frames,
        cfg_scale=args.cfg_scale,
        progress_bar=False,
        stream=True,
        first_chunk_frames=args.first_chunk_frames,
        generator=generator,
        callback=callback,
        logits_processor=stamper,
    )
    for chunk in stream:
        if chunk.audio.shape[-1]:  # on the CPU already when the model runs on CUDA
            marks["audio"] = time.perf_counter()
            marks["audio_frames"] = chunk.frames[1]
            break
    stream.close()
    return marks


def environment(torch, device: str) -> str:
    if not device.startswith("cuda"):
        return f"{device} | torch {torch.__version__}"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return (
        f"{torch.cuda.get_device_name()} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
        f"triton {triton_version}"
    )


# ------------------------------------------------------------------------------------------------ parent


def write_checkpoint(directory: str) -> None:
    """A real-size Zonos-v0.1-hybrid checkpoint of random bf16 weights (config.json, model.safetensors) in
    ``directory``, for ``--checkpoint`` runs (a child process of its own: the parent stays free of torch)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from common import CONFIGS, random_model
    from safetensors.torch import save_file

    model = random_model("hybrid", device="cuda")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIGS / "zonos-v0.1-hybrid_config.json", out / "config.json")
    save_file({k: v.cpu() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))


def child_env(root: Path) -> dict[str, str]:
    """The environment of every child: this one's, with a bytecode cache in the cache root shared by all cases
    (``PYTHONDONTWRITEBYTECODE`` dropped). An installed package has its bytecode compiled; a machine that writes
    none (the device image sets PYTHONDONTWRITEBYTECODE=1 over a site-packages without bytecode) compiles the
    sources of torch and its lazily imported parts in every process: torch's import took 3.3-5.2 s there, and
    torch._dynamo with sympy, imported at a model's first meta-device op, ~4 s more."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def prime_bytecode(root: Path) -> None:
    """Import what a child imports and run an op on the meta device, so the bytecode cache holds all of it."""
    code = "import torch, zonos.model, zonos_accel.triton; torch.empty(1, device='meta') * 2"
    subprocess.run([sys.executable, "-c", code], env=child_env(root), check=True, timeout=600)


def run_child(args: argparse.Namespace, case: str, cache: Path) -> dict:
    _, _, extra = CASES[case]
    env = child_env(cache.parent)
    env.update(extra)
    env.update(
        TRITON_CACHE_DIR=str(cache / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        CUTE_DSL_CACHE_DIR=str(cache / "cute"),
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
    cmd += ["--device", args.device, "--frames", str(args.frames), "--prefix", str(args.prefix)]
    cmd += ["--first-chunk-frames", str(args.first_chunk_frames), "--cfg-scale", str(args.cfg_scale)]
    cmd += ["--max-seqlen", str(args.max_seqlen)]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--cute-gemv"] if args.cute_gemv else []
    cmd += ["--cute-scan"] if args.cute_scan else []
    cmd += ["--checkpoint", args.checkpoint] if args.checkpoint else []
    if case in args.py_spy:  # sampled from outside: every thread, the engine's included
        cmd = ["py-spy", "record", "--rate", str(SPY_RATE), "--format", "raw", "--output", str(spy_file(cache, case)),
               "--"] + cmd  # fmt: skip
    env[SPAWN_ENV] = repr(time.perf_counter())
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=args.child_timeout)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
        else:
            print(f"  [{case}] {line}")
    if proc.returncode or result is None:
        raise RuntimeError(f"case {case}: the child exited with {proc.returncode} and no result (stderr above)")
    return result


SPY_RATE = 200  # samples per second


def spy_file(cache: Path, case: str) -> Path:
    return cache / f"py-spy-{case}.txt"


def spy_rows(case: str, path: Path, top: int = 30) -> list[dict]:
    """The ``top`` functions of a py-spy raw (collapsed-stack) recording by inclusive seconds, over all threads
    (a function counted once per sample however deep it recurs)."""
    inclusive: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        names = set()
        for frame in stack.split(";"):
            name, _, where = frame.partition(" (")
            source = where.split(":")[0]
            if source.startswith("<frozen") or source.endswith("first_request.py"):  # import machinery, this script
                continue
            names.add(f"{name} ({'/'.join(source.split('/')[-2:])})")
        for name in names:
            inclusive[name] = inclusive.get(name, 0) + int(count)
    ranked = sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]
    return [{"case": case, "function (file)": k, "s": f"{n / SPY_RATE:.2f}"} for k, n in ranked]


def row(case: str, result: dict) -> dict:
    s = result["stamps"]
    r1, r2 = result["requests"]

    def ms(r: dict, key: str) -> str:
        return f"{(r[key] - r['call']) * 1e3:.1f}" if key in r else "none"

    def caps(r: dict) -> str:
        return "-" if r["captures"] is None else str(r["captures"])

    return {
        "case": case,
        "spawn → start s": f"{s['start'] - s['spawn']:.3f}",
        "import s": f"{s['imports'] - s['start']:.2f}",
        "of which torch / zonos / accelerators s": (
            f"{s['torch'] - s['start']:.2f} / {s['zonos'] - s['torch']:.2f} / {s['imports'] - s['zonos']:.2f}"
        ),
        "build s": f"{s['ready'] - s['imports']:.2f}",
        "of which codec / backbone / accelerators s (from_local: backbone and accelerators)": (
            f"{s['codec'] - s['imports']:.2f} / {s['model'] - s['codec']:.2f} / {s['ready'] - s['model']:.2f}"
            if "codec" in s
            else "-"
        ),
        "spawn → model ready s": f"{s['ready'] - s['spawn']:.2f}",
        "warm-up s": f"{s['warmed'] - s['ready']:.2f}" if s["warmed"] - s["ready"] > 1e-3 else "-",
        "1st request → prefill ms": ms(r1, "prefill"),
        "1st request → first step ms": ms(r1, "step"),
        "1st request → first audio ms": ms(r1, "audio"),
        "2nd request → first step ms": ms(r2, "step"),
        "2nd request → first audio ms": ms(r2, "audio"),
        "spawn → first audio s": f"{r1['audio'] - s['spawn']:.2f}" if "audio" in r1 else "none",
        "model ready → first audio s": f"{r1['audio'] - s['ready']:.2f}" if "audio" in r1 else "none",
        "graphs captured (decode steps + prefill pieces) after 1st / 2nd": f"{caps(r1)} / {caps(r2)}",
        "torch._dynamo imported at ready / end": " / ".join("yes" if d else "no" for d in result["dynamo"]),
    }


def compile_rows(case: str, compiles: dict[str, list], top: int = 12) -> list[dict]:
    """The ``top`` kernels by compile seconds, then the total."""
    ranked = sorted(compiles.items(), key=lambda kv: -kv[1][1])
    out = [{"case": case, "kernel": k, "compiles": n, "s": f"{t:.2f}"} for k, (n, t) in ranked[:top]]
    n_all, t_all = sum(v[0] for v in compiles.values()), sum(v[1] for v in compiles.values())
    out.append({"case": case, "kernel": f"all {len(compiles)} kernels", "compiles": n_all, "s": f"{t_all:.2f}"})
    return out


def varying_constexprs(case: str, constexprs: dict[str, list[dict[str, str]]], top: int = 4) -> list[dict]:
    """For the ``top`` kernels by compiles: how many distinct constexpr sets their compiles had (the rest of the
    compiles differ only in the integer and alignment specializations of their runtime arguments), and which
    constexprs took more than one value."""
    out = []
    for name, sets in sorted(constexprs.items(), key=lambda kv: -len(kv[1]))[:top]:
        distinct = {tuple(sorted(c.items())) for c in sets}
        keys = sorted({k for c in sets for k in c})
        varying = [f"{k} ({len({c.get(k) for c in sets})})" for k in keys if len({c.get(k) for c in sets}) > 1]
        out.append({"case": case, "kernel": name, "compiles": len(sets), "constexpr sets": len(distinct),
                    "constexprs that vary (values)": ", ".join(varying) or "none"})  # fmt: skip
    return out


def markdown(rows: list[dict], title: str) -> str:
    keys = list(rows[0])
    out = [f"\n### {title}\n", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in rows]
    return "\n".join(out)


def parent(args: argparse.Namespace) -> int:
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {list(CASES)}")
    keep = args.cache_root is not None
    root = Path(args.cache_root) if keep else Path(tempfile.mkdtemp(prefix="zonos-first-request-"))
    rows, env, compiles, varying, spied = [], None, [], [], []
    if args.write_checkpoint:
        args.checkpoint = str(root / "checkpoint")
        writer = [sys.executable, str(Path(__file__).resolve()), "--write-checkpoint-to", args.checkpoint]
        subprocess.run(writer, check=True, timeout=args.child_timeout, env=child_env(root))
    prime_bytecode(root)
    try:
        for case in cases:
            group, fresh, _ = CASES[case]
            cache = root / group
            if fresh:
                shutil.rmtree(cache, ignore_errors=True)
            elif not cache.exists():
                print(f"priming the {group} caches for {case} (not reported)", flush=True)
                run_child(args, "cold", cache)
            cache.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            result = run_child(args, case, cache)
            env = result["env"]
            rows.append(row(case, result))
            if result["compiles"]:
                compiles += compile_rows(case, result["compiles"])
            if case in args.py_spy:
                spied += spy_rows(case, spy_file(cache, case))
            if result["constexprs"] and case == "cold":
                varying += varying_constexprs(case, result["constexprs"])
            r = rows[-1]
            print(
                f"{case}: done in {time.perf_counter() - t0:.1f} s (model ready {r['spawn → model ready s']} s after "
                f"spawn, first request → first audio {r['1st request → first audio ms']} ms)",
                flush=True,
            )
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

    model = "tiny hybrid fp32, accelerators off" if args.tiny else "Zonos-v0.1-hybrid random bf16, use_accelerators()"
    model += ", read from a checkpoint by from_local" if args.checkpoint else ""
    gemv = (", use_cute_gemv" if args.cute_gemv else "") + (", use_cute_scan" if args.cute_scan else "")
    title = (
        f"First request in a fresh process ({model}{gemv}; {env}; prefix {args.prefix}, CFG {args.cfg_scale}, "
        f"first chunk {args.first_chunk_frames} frames)"
    )
    print(markdown(rows, title))
    print(
        "\nimport: interpreter start → torch, zonos and accelerator packages imported; build: random weights, "
        "codec, use_accelerators(), synchronized (no checkpoint read); request columns: ms from the generate "
        "call (prefill and first step stamped after a device sync); captures: graphs the engine's graph cache holds "
        "after each request."
    )
    if compiles:
        print(markdown(compiles, "Triton compiles (or disk-cache loads) by kernel, longest first"))
    if spied:
        print(markdown(spied, "Where the child's time goes (py-spy, all threads, inclusive seconds)"))
    if varying:
        print(markdown(varying, "What the most compiled kernels' specializations differ in (cold)"))
    measured = {r["case"]: r for r in rows}
    for case, column, limit in () if args.tiny else TARGETS:
        value = measured.get(case, {}).get(column, "none")
        if value != "none":
            verdict = "met" if float(value) <= limit else "missed"
            print(f"target (issue 36): {case}, {column} {value} vs ≤ {limit}: {verdict}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny hybrid in fp32 with accelerators off (smoke test)")
    ap.add_argument("--cases", default="cold,warm", help=f"comma-separated, of {list(CASES)}")
    ap.add_argument("--frames", type=int, default=64, help="max_new_tokens of each request (stopped at first audio)")
    ap.add_argument("--prefix", type=int, default=120, help="prefix tokens (random conditioning)")
    ap.add_argument("--first-chunk-frames", type=int, default=2)
    ap.add_argument("--cfg-scale", type=float, default=2.0)
    ap.add_argument("--max-seqlen", type=int, default=4096)
    ap.add_argument("--cute-gemv", action="store_true", help="use_cute_gemv=True as well")
    ap.add_argument("--cute-scan", action="store_true", help="use_cute_scan=True as well")
    ap.add_argument(
        "--checkpoint",
        help="load the model with Zonos.from_local from this directory (config.json, model.safetensors) instead of "
        "building random weights in the process, so model ready includes the checkpoint read",
    )
    ap.add_argument(
        "--write-checkpoint",
        action="store_true",
        help="write a random real-size checkpoint into the cache root first (not timed) and load it as --checkpoint",
    )
    ap.add_argument("--write-checkpoint-to", help=argparse.SUPPRESS)
    ap.add_argument("--cache-root", help="keep the kernel caches here (default: a temporary directory, removed)")
    ap.add_argument("--child-timeout", type=float, default=900.0, help="seconds per child process")
    ap.add_argument(
        "--py-spy",
        default="",
        metavar="CASES",
        help="comma-separated cases whose child runs under py-spy (must be on PATH): the functions with the most "
        "inclusive time over all threads, from spawn to exit",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.py_spy = {c.strip() for c in args.py_spy.split(",") if c.strip()}
    if args.tiny and args.max_seqlen == 4096:
        args.max_seqlen = 512
    if args.write_checkpoint_to:
        write_checkpoint(args.write_checkpoint_to)
        return 0
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
