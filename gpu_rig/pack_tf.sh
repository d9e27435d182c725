#!/usr/bin/env bash
# Stage 1 of the GPU rig, on the development machine: TensorFlow 2.21 for the GPU machine's Python 3.12, packed
# into pieces a device call can carry (its working tree travels within 64 MiB), plus the small wheels the GPU
# machine lacks and a zstd binary (it has none). Writes .device_carry/tf/NN/ (one piece each) and
# .device_carry/wheels/. Usage, from the repository root: gpu_rig/pack_tf.sh
# The op libraries are built here too (gpu_rig/build_ops.sh), so TensorFlow's headers (tensorflow/include) stay
# behind.
set -euo pipefail
carry=.device_carry
downloads=${BERTSERVE_RIG_DOWNLOADS:-$carry/downloads}
piece_bytes=${BERTSERVE_RIG_PIECE:-52M}
# The GPU machine's own numpy, ml_dtypes, grpcio, h5py, absl, wrapt, opt-einsum and flatbuffers serve TensorFlow;
# grpcio-health-checking must match its grpcio (1.84).
wheels=(tensorflow==2.21.0 tensorflow-serving-api==2.21.0 protobuf==7.36.2 astunparse gast google-pasta termcolor
  nvidia-cuda-runtime-cu12 grpcio-health-checking==1.84.0)
mkdir -p "$downloads"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d "$downloads" "${wheels[@]}"
rm -rf "$carry/tf" "$carry/wheels" && mkdir -p "$carry/tf" "$carry/wheels"
find "$downloads" -name '*.whl' ! -name 'tensorflow-*' -exec cp {} "$carry/wheels/" \;
cp "$(command -v zstd)" "$carry/wheels/zstd"
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
python3 -m zipfile -e "$downloads"/tensorflow-2.21.0-cp312-*.whl "$unpacked"
rm -rf "$unpacked/tensorflow/include"
tar -C "$unpacked" -cf - . | zstd -q -T0 -8 | split -b "$piece_bytes" -d - "$carry/tf/tf.tar.zst."
for piece in "$carry"/tf/tf.tar.zst.*; do  # one folder a piece: each call names one folder in `carry`
  mkdir -p "$carry/tf/${piece##*.}" && mv "$piece" "$carry/tf/${piece##*.}/"
done
du -sh "$carry"/tf/* "$carry/wheels"
