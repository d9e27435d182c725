#!/usr/bin/env bash
# The GPU rig's stages on the GPU machine, from the repository root of a device call. /tmp outlives the call while
# the machine stays warm (about 30 s idle), so the stages are calls made back to back; `source gpu_rig/env.sh`
# in every later call finds what they left under /tmp/bertserve_rig.
#   gpu_rig/device.sh piece            keep the TensorFlow piece this call carried (carry: .device_carry/tf/NN)
#   gpu_rig/device.sh install          the last piece too, then unpack TensorFlow and the wheels, map CUDA 12 library
#                                      names, keep the op libraries (carry: .device_carry/tf/NN, .device_carry/wheels,
#                                      .device_carry/ops); ends by importing TensorFlow with the ops and GPU:0
#   gpu_rig/device.sh keep DIR...      keep carried folders (reference data, models) under /tmp/bertserve_rig
set -euo pipefail
rig=/tmp/bertserve_rig
mkdir -p "$rig/chunks"
keep_pieces() { cp .device_carry/tf/*/tf.tar.zst.* "$rig/chunks/" 2>/dev/null || true; ls "$rig/chunks"; }

case ${1:?usage: device.sh piece|install|keep DIR...} in
  piece)
    keep_pieces ;;
  install)
    keep_pieces
    t0=$(date +%s)
    rm -rf "$rig/site" && mkdir -p "$rig/site" "$rig/bin"
    cp .device_carry/wheels/zstd "$rig/bin/" && chmod +x "$rig/bin/zstd"
    cat "$rig"/chunks/tf.tar.zst.* | "$rig/bin/zstd" -q -d | tar x -C "$rig/site"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$rig/site" .device_carry/wheels/*.whl
    # TensorFlow 2.21 is a CUDA 12 build: it dlopens CUDA 12 names and registers no GPU unless all of them open.
    # The GPU machine has CUDA 13; this maps the names for a test rig (a deployment installs TF's and-cuda wheels).
    # Our kernels link the CUDA 13 runtime statically and cuBLASLt 13 by its own name, so they need none of it.
    names=$rig/cuda12_names
    rm -rf "$names" && mkdir -p "$names"
    cuda=/usr/local/cuda/lib64
    torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    ln -s "$cuda/libcublas.so.13" "$names/libcublas.so.12"
    ln -s "$cuda/libcublasLt.so.13" "$names/libcublasLt.so.12"
    ln -s "$cuda/libcufft.so.12" "$names/libcufft.so.11"
    ln -s "$cuda/libcusolver.so.12" "$names/libcusolver.so.11"
    ln -s "$cuda/libcusparse.so.12" "$names/libcusparse.so.12"
    ln -s "$cuda/libcupti.so.13" "$names/libcupti.so.12"
    ln -s "$cuda/libnvrtc.so.13" "$names/libnvrtc.so.12"
    ln -s "$cuda/libnvJitLink.so.13" "$names/libnvJitLink.so.12"
    ln -s "$(ls "$torch_site"/nvidia/cudnn/lib/libcudnn.so.9 "$torch_site"/nvidia/cu13/lib/libcudnn.so.9 2>/dev/null | head -1)" \
      "$names/libcudnn.so.9"
    nccl=$(ls "$torch_site"/nvidia/nccl/lib/libnccl.so.2 "$torch_site"/nvidia/cu13/lib/libnccl.so.2 2>/dev/null | head -1 || true)
    [[ -n $nccl ]] && ln -s "$nccl" "$names/libnccl.so.2"
    ln -s "$rig/site/nvidia/cuda_runtime/lib/libcudart.so.12" "$names/libcudart.so.12"
    rm -rf "$rig/ops" && cp -r .device_carry/ops "$rig/ops"
    echo "install took $(( $(date +%s) - t0 )) s"
    source gpu_rig/env.sh
    python3 - <<'PY'
import time
t0 = time.time()
import tensorflow as tf
from bertserve import custom_ops
custom_ops.load_op_library()
gpus = tf.config.list_physical_devices("GPU")
print(f"tensorflow {tf.__version__} imported in {time.time() - t0:.1f} s; GPUs {gpus}; ops loaded from "
      f"{custom_ops.library_path()}")
assert gpus, "TensorFlow lists no GPU"
PY
    ;;
  keep)
    shift
    for dir in "$@"; do mkdir -p "$rig/$(basename "$dir")" && cp -r "$dir"/. "$rig/$(basename "$dir")/"; done
    du -sh "$rig"/* ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
