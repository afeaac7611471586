"""Ray Serve deployment of the speech server: one replica per GPU, each with its own model and engine, streaming
responses, autoscaling on the requests each replica holds (its slots plus its queue).

The replicas run the same FastAPI app as ``zonos-tts serve`` (:func:`zonos.serve.app.create_app`); Ray's proxy
routes each request to a replica and streams the response through. Run it on a Ray cluster (or a local Ray) with
``serve run``, whose ``key=value`` arguments go to :func:`app_builder`::

    pip install 'zonos-accel[server]' 'ray[serve]'
    ray start --head                       # once per cluster; GPU workers: ray start --address HEAD:6379
    serve run zonos.serve.ray_app:app_builder model=Zyphra/Zonos-v0.1-hybrid slots=64 max_replicas=8
    curl -sSf localhost:8000/v1/audio/speech -o hello.wav -H 'Content-Type: application/json' \\
         -d '{"model": "zonos", "input": "Hello from Ray.", "response_format": "wav"}'

``random=hybrid`` builds the published architecture with random weights (for load tests without a download),
``gpus=0`` runs replicas on CPUs. Without Ray, the same app runs on one machine with ``zonos-tts serve``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zonos.serve.app import create_app
from zonos.serve.settings import ServerSettings

__all__ = ["ModelLoader", "app_builder", "deployment"]


def deployment(
    load_model: Callable[[], Any],
    settings: ServerSettings | None = None,
    num_replicas: int | None = None,
    min_replicas: int = 1,
    max_replicas: int = 1,
    gpus_per_replica: float = 1.0,
    name: str = "zonos-tts",
):
    """A bound Ray Serve application of the speech server; pass it to ``serve.run``.

    Each replica calls ``load_model()`` (pickled to it, so it must not hold CUDA tensors) and starts an engine with
    ``settings.slots`` slots. ``num_replicas`` fixes the count; otherwise Ray autoscales between ``min_replicas``
    and ``max_replicas``, aiming at ``slots`` requests per replica (a replica takes ``slots + queue_size`` before
    Ray queues requests for it in the proxy).
    """
    from ray import serve

    settings = settings or ServerSettings()
    slots = settings.slots or 4
    options: dict[str, Any] = dict(
        name=name,
        ray_actor_options={"num_gpus": gpus_per_replica},
        max_ongoing_requests=slots + settings.queue_size,
        health_check_period_s=10,
    )
    if num_replicas is not None:
        options["num_replicas"] = num_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": slots,
            "upscale_delay_s": 5,
            "downscale_delay_s": 120,
        }

    def build_app():  # evaluated on each replica: the app is built there, not pickled
        return create_app(load_model, settings)

    speech = serve.deployment(**options)(serve.ingress(build_app)())
    return speech.bind()


class ModelLoader:
    """A picklable model loader (paths and names only; the model is built on the replica, on its device): a Hub
    repo or local directory for the model and the codec, or ``random`` (an architecture name) for random weights."""

    def __init__(
        self, model: str, codec: str, random: str | None = None, device: str | None = None, max_seqlen: int = 4096
    ):
        self.model, self.codec, self.random, self.device = model, codec, random, device
        self.max_seqlen = max_seqlen

    def __call__(self):
        import torch

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.random:
            from pathlib import Path

            from zonos.codec import DACAutoencoder
            from zonos.config import ZonosConfig
            from zonos.model import Zonos

            config = Path(__file__).resolve().parents[2] / "tests" / "data" / f"zonos-v0.1-{self.random}_config.json"
            with torch.device(device):
                model = Zonos(ZonosConfig.from_json(config), max_seqlen=self.max_seqlen)
            for n, p in model.state_dict().items():
                if not n.endswith(("A_log", "dt_bias", "mixer.D")) and p.ndim > 1:
                    p.data.normal_(0.0, 1.0 if "embed" in n else p.shape[-1] ** -0.5)
            model = model.to(torch.bfloat16 if device.startswith("cuda") else torch.float32).eval()
            model.autoencoder = DACAutoencoder.from_pretrained(self.codec, device=device)
            model.use_accelerators()
            return model
        from zonos.codec import DACAutoencoder
        from zonos.model import Zonos

        codec = DACAutoencoder.from_pretrained(self.codec, device=device)
        return Zonos.from_pretrained(self.model, device=device, autoencoder=codec, max_seqlen=self.max_seqlen)


def app_builder(args: dict[str, str]):
    """``serve run zonos.serve.ray_app:app_builder key=value ...``: model, codec, random (hybrid|transformer),
    device, max_seqlen, slots, vocoder_batching (0 or 1), queue_size, replicas (fixed count) or
    min_replicas/max_replicas, gpus (per replica), api_key, voices_dir, rate_limit (per minute; 0 none)."""
    from pathlib import Path

    known = {
        "model",
        "codec",
        "random",
        "device",
        "max_seqlen",
        "slots",
        "vocoder_batching",
        "queue_size",
        "replicas",
        "min_replicas",
        "max_replicas",
        "gpus",
        "api_key",
        "voices_dir",
        "rate_limit",
    }
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}: use {', '.join(sorted(known))}")
    settings = ServerSettings(
        api_key=args.get("api_key"),
        voices_dir=Path(args["voices_dir"]) if "voices_dir" in args else None,
        slots=int(args.get("slots", 8)),
        vocoder_batching=args.get("vocoder_batching", "1") not in ("0", "false", "False", ""),
        queue_size=int(args.get("queue_size", 64)),
        rate_limit=float(args.get("rate_limit", 0)) or None,
        model_name=args.get("model", "Zyphra/Zonos-v0.1-hybrid"),
    )
    loader = ModelLoader(
        args.get("model", "Zyphra/Zonos-v0.1-hybrid"),
        args.get("codec", "descript/dac_44khz"),
        args.get("random"),
        args.get("device"),
        int(args.get("max_seqlen", 4096)),
    )
    return deployment(
        loader,
        settings,
        num_replicas=int(args["replicas"]) if "replicas" in args else None,
        min_replicas=int(args.get("min_replicas", 1)),
        max_replicas=int(args.get("max_replicas", 1)),
        gpus_per_replica=float(args.get("gpus", 1)),
    )
