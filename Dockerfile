# Zonos streaming web demo on an NVIDIA GPU.
#
#   docker build -t zonos-accel .
#   docker run --rm --gpus all -p 7860:7860 -v ~/.cache/huggingface:/root/.cache/huggingface zonos-accel
#   open http://localhost:7860
#
# Weights are downloaded from the Hugging Face Hub on first start into the mounted cache (a few GB: the
# hybrid, the DAC codec, and the speaker model once a voice is cloned). Arguments after the image name replace the
# default command, e.g. `docker run ... zonos-accel python gradio_interface.py --host 0.0.0.0 --model
# Zyphra/Zonos-v0.1-transformer`.
# The host needs the NVIDIA Container Toolkit and a driver for CUDA 12.8 (R570 or newer).

# Any pytorch/pytorch CUDA 12.x *runtime* tag works (torch >= 2.4); no CUDA code is compiled at build time.
ARG BASE_IMAGE=pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False

# espeak-ng: text to phonemes (phonemizer); ffmpeg: Gradio encodes the streamed audio for the browser with it;
# gcc + libc6-dev: Triton compiles a small host-side launcher per kernel at run time (runtime images lack a C
# compiler, and without one the GPU fast paths fail with "Failed to find C compiler").
RUN apt-get update \
    && apt-get install -y --no-install-recommends espeak-ng ffmpeg gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# The package and its dependencies first, so editing the demo script does not redo this layer.
COPY pyproject.toml README.md ./
COPY zonos ./zonos
COPY zonos_accel ./zonos_accel
# The `gpu` extra without mamba-ssm (installed below, best-effort) plus the `demo` extra. torch comes from
# the base image and is kept (it already satisfies torch>=2.4; its triton 3.5 has the grid-dependency control
# our kernels use, which needs triton>=3.4).
RUN pip install '.[demo]' 'triton>=3.4' 'nvidia-cutlass-dsl>=4.3'

# mamba-ssm: only its Triton kernels are used (zonos_accel.triton). Its PyPI release is an sdist whose setup
# compiles a Mamba-1 CUDA extension we never call, which needs nvcc (absent here): skip that build, and
# give the package's unconditional `import selective_scan_cuda` a placeholder. If anything here fails the
# image still works: Zonos falls back to its torch ops on the GPU (slower decode steps, same output).
RUN pip install packaging wheel ninja \
    && MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip install --no-build-isolation 'mamba-ssm>=2.2' \
    && (python -c "import selective_scan_cuda" 2>/dev/null \
        || echo "# placeholder for mamba_ssm's Mamba-1 CUDA extension (unused by Zonos)" \
           > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/selective_scan_cuda.py") \
    && python -c "import mamba_ssm.ops.triton.selective_state_update" \
    || echo "WARNING: mamba-ssm is not usable; Zonos will run its torch ops instead of mamba_ssm's Triton kernels"

COPY gradio_interface.py sample.py ./

EXPOSE 7860
CMD ["python", "gradio_interface.py", "--host", "0.0.0.0", "--port", "7860"]
