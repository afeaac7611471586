#!/bin/sh
# The image's entrypoint: refuse to start when no GPU is visible (without `--gpus all` the container sees
# none, and the 1.6B model would quietly run in fp32 on the CPU, far slower than real time), then run the
# command (the image's default: the web demo).
set -e

# One kernel cache for every program in the image: the zonos-tts commands apply ZONOS_KERNEL_CACHE themselves,
# and the compilers' own variables, set here in zonos_accel.kernel_cache's layout (a subdirectory per compiler),
# reach the rest (the demo, one's own scripts).
if [ -n "${ZONOS_KERNEL_CACHE:-}" ]; then
    export TRITON_CACHE_DIR="$ZONOS_KERNEL_CACHE/triton" CUTE_DSL_CACHE_DIR="$ZONOS_KERNEL_CACHE/cutedsl"
fi

case " $* " in
*" --help "* | *" -h "* | *" --version "*) ;; # help and version need no GPU
*)
    if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        if [ "${ZONOS_ALLOW_CPU:-0}" = 1 ]; then
            echo "warning: no CUDA GPU is visible; running on the CPU (ZONOS_ALLOW_CPU=1), which is slow" >&2
        else
            cat >&2 <<'MSG'
error: no CUDA GPU is visible inside this container.
  Give it the GPUs:  docker run --gpus all ...
  (the host needs the NVIDIA driver and the NVIDIA Container Toolkit; `nvidia-smi` must work on the host)
  To run on the CPU anyway (slow: the model runs in fp32), add  -e ZONOS_ALLOW_CPU=1
MSG
            exit 1
        fi
    fi
    ;;
esac

exec "$@"
