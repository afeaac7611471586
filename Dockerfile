# Zonos streaming text-to-speech on an NVIDIA GPU: the web demo by default, or any zonos-tts command.
#
#   docker build -t zonos-accel .
#   docker run --rm --gpus all -p 7860:7860 -v zonos-cache:/cache -v zonos-kernels:/kernels zonos-accel
#   docker run --rm --gpus all -v zonos-cache:/cache -v zonos-kernels:/kernels zonos-accel \
#       zonos-tts speak "Hello from Zonos." --out - > hello.wav
#
# The volume at /cache keeps the Hugging Face downloads (HF_HOME: a few GB for the model, the DAC codec and,
# once a voice is cloned, the speaker model); the one at /kernels (ZONOS_KERNEL_CACHE) the compiled Triton and
# CuTeDSL kernels, which fit only this GPU model and these library versions, so it can be dropped on its own
# (`zonos-tts warmup` fills it ahead of the first request). Without a GPU the
# container stops with a message saying how to pass one (--gpus all); -e ZONOS_ALLOW_CPU=1 runs on the CPU
# anyway (slowly). The host needs the NVIDIA Container Toolkit and a driver for CUDA 12.8 (R570 or newer).

# A pytorch/pytorch CUDA 12.x *runtime* image: torch 2.9.0 with Triton 3.5.0. No CUDA code is compiled here.
ARG BASE_IMAGE=pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HOME=/cache/huggingface \
    ZONOS_KERNEL_CACHE=/kernels \
    XDG_CACHE_HOME=/cache

# espeak-ng: text to phonemes (phonemizer); ffmpeg: Gradio's audio conversions; gcc + libc6-dev: Triton compiles a
# small host-side launcher per kernel at run time (without a C compiler the GPU fast paths fail). Ubuntu drops
# superseded package versions from its archive, so exact apt pins would break rebuilds: the base image's
# release pins them instead.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends espeak-ng ffmpeg gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/zonos
COPY docker/constraints.txt docker/entrypoint.sh ./

# The package, the demo and their Python dependencies at the versions in constraints.txt, with the `gpu`
# extra's wheels; torch and Triton stay the base image's (they satisfy torch>=2.4 and triton>=3.4).
COPY pyproject.toml README.md LICENSE gradio_interface.py ./
COPY zonos ./zonos
COPY zonos_accel ./zonos_accel
RUN pip install --constraint constraints.txt '.[demo,gpu]'

# Run as an unprivileged user that owns the cache volumes (a named volume starts with this ownership; a bind
# mount must be writable by uid 1000).
RUN useradd --create-home --uid 1000 --shell /bin/sh zonos \
    && mkdir -p /cache/huggingface /kernels \
    && chown -R zonos:zonos /cache /kernels
USER 1000:1000
WORKDIR /home/zonos
VOLUME ["/cache", "/kernels"]

EXPOSE 7860
# The demo serves its page once the model is loaded and warmed up (a first start downloads the weights first);
# the check probes the default command's port.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=5)"]

ENTRYPOINT ["/opt/zonos/entrypoint.sh"]
CMD ["zonos-tts", "demo", "--host", "0.0.0.0", "--port", "7860"]
