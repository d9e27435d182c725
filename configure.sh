#!/usr/bin/env bash
# Points the Bazel build at the pip TensorFlow and at the offline repository stand-ins; writes .bazelrc.generated
# (git-ignored, read by .bazelrc). Non-interactive; run again after changing interpreter or TensorFlow.
#
# Interpreter: $PYTHON if set, else ./.venv/bin/python if present, else python3 on PATH.
# The `platforms` repository comes from Debian's bazel-platforms package ($BAZEL_PLATFORMS_DIR overrides).
set -euo pipefail

WORKSPACE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$WORKSPACE_DIR"

die() { echo "configure.sh: $*" >&2; exit 1; }

if [[ -n "${PYTHON:-}" ]]; then
  python_cmd="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
  python_cmd=.venv/bin/python
else
  python_cmd=python3
fi
python_bin="$(command -v "$python_cmd")" || die "no Python interpreter '$python_cmd' (set PYTHON=/path/to/python)"
python_bin="$(cd "$(dirname "$python_bin")" && pwd)/$(basename "$python_bin")"  # absolute, venv symlink kept

platforms_dir="${BAZEL_PLATFORMS_DIR:-/usr/share/bazel/tools/platforms}"
[[ -f "$platforms_dir/WORKSPACE" ]] ||
  die "no Bazel 'platforms' repository at $platforms_dir (apt-get install bazel-platforms, or set BAZEL_PLATFORMS_DIR)"

# One line per value, read from tf.sysconfig so ABI flags always match the installed TensorFlow.
tf_config="$(TF_CPP_MIN_LOG_LEVEL=3 "$python_bin" - <<'PY' 2>/dev/null
import os
import tensorflow as tf

lib_dir, lib_name = None, None
for flag in tf.sysconfig.get_link_flags():
    if flag.startswith("-L"):
        lib_dir = flag[2:]
    elif flag.startswith("-l:"):
        lib_name = flag[3:]
    elif flag.startswith("-l"):
        lib_name = "lib%s.so" % flag[2:]
print(tf.sysconfig.get_include())
print(os.path.join(lib_dir or tf.sysconfig.get_lib(), lib_name))
print(" ".join(f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")))
print(tf.__version__)
PY
)" || die "$python_bin cannot import tensorflow (pip install tensorflow, or set PYTHON=/path/to/python)"
{ read -r tf_header_dir; read -r tf_library; read -r tf_cxxflags; read -r tf_version; } <<<"$tf_config"
[[ -f "$tf_library" ]] || die "TensorFlow's framework library $tf_library does not exist"

generated=.bazelrc.generated
{
  echo "# Written by configure.sh for $python_bin (TensorFlow $tf_version); do not edit, run ./configure.sh again."
  for command in build query fetch sync; do
    echo "$command --override_repository=\"rules_cc=$WORKSPACE_DIR/third_party/rules_cc\""
    echo "$command --override_repository=\"rules_java=$WORKSPACE_DIR/third_party/rules_java\""
    echo "$command --override_repository=\"platforms=$platforms_dir\""
    echo "$command --repo_env=\"TF_HEADER_DIR=$tf_header_dir\""
    echo "$command --repo_env=\"TF_SHARED_LIBRARY=$tf_library\""
    echo "$command --repo_env=\"TF_CXXFLAGS=$tf_cxxflags\""
    echo "$command --repo_env=\"TF_VERSION=$tf_version\""
  done
} >"$generated"
echo "configure.sh: wrote $generated (TensorFlow $tf_version from $python_bin)"
