#!/usr/bin/env bash
# Builds tensorflow_model_server with the bertserve ops linked in, without Docker: clones tensorflow/serving at
# the release tag (unless <dir> already holds a checkout), links the ops in and runs Bazel there.
# Needs network access, the Bazel version that release pins (bazelisk reads its .bazelversion) and TF Serving's
# build dependencies (tensorflow_serving/tools/docker/Dockerfile.devel lists them).
# Usage: build.sh [--gpu] [<tensorflow-serving-dir>]
#   (env: TF_SERVING_VERSION=2.21.0, TF_SERVING_BUILD_OPTIONS=--config=release)
# --gpu links the TF GPU kernels too, in a CUDA build (--config=cuda added). It needs the CUDA core's archive
# first (`make gpu-ops`, or custom_ops/kernels/cuda/build.sh build/cuda); BERTSERVE_CUDA_CORE and
# BERTSERVE_CUDA_HOME say where it and the CUDA 13 headers are, if not at the defaults (third_party/cuda_core.bzl).
set -euo pipefail

gpu_flags=()
if [[ ${1:-} == --gpu ]]; then
  gpu_flags=(--gpu)
  shift
fi

version="${TF_SERVING_VERSION:-2.21.0}"
serving="${1:-tensorflow-serving-$version}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ ! -d "$serving/.git" ]]; then
  git clone --depth 1 --branch "$version" https://github.com/tensorflow/serving.git "$serving"
fi
"$here/add_bertserve_ops.sh" "${gpu_flags[@]}" "$serving" "$here/../.."
cd "$serving"
# shellcheck disable=SC2086  # the options are a list of flags
bazel build ${TF_SERVING_BUILD_OPTIONS:---config=release} ${gpu_flags:+--config=cuda} --verbose_failures \
  tensorflow_serving/model_servers:tensorflow_model_server
echo "built $(pwd)/bazel-bin/tensorflow_serving/model_servers/tensorflow_model_server"
