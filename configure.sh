#!/usr/bin/env bash
# Points the Bazel build at the pip wheels it compiles against (TensorFlow, mkl + mkl-include) and at the offline
# repository stand-ins; writes .bazelrc.generated (git-ignored, read by .bazelrc). Non-interactive; run it again
# after changing the interpreter or either wheel.
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

# PREFIX_NAME=value lines, read from the wheels themselves so flags (ABI, symbol prefix) always match them.
# TensorFlow logs on stderr while importing: keep it for the error message only.
stderr_log="$(mktemp)"
trap 'rm -f "$stderr_log"' EXIT
# MKL's paths come from setup.py (imported from the workspace root, argv[1]), so both builds link the same files.
wheel_config="$(TF_CPP_MIN_LOG_LEVEL=3 "$python_bin" - "$WORKSPACE_DIR" 2>"$stderr_log" <<'PY'
import os
import sys
from importlib import metadata

try:
    import tensorflow as tf
except ImportError as e:
    sys.exit(f"cannot import tensorflow ({e}): pip install tensorflow, or set PYTHON=/path/to/python")

sys.path.insert(0, sys.argv[1])
import setup  # noqa: E402  (the workspace's setup.py; setuptools.setup() runs only when it is the main script)


def emit(prefix, header_dir, library, copts, version):
    for name, value in (("HEADER_DIR", header_dir), ("SHARED_LIBRARY", library), ("COPTS", " ".join(copts)),
                        ("VERSION", version)):
        print(f"{prefix}_{name}={value}")


# TensorFlow: tf.sysconfig, as for any custom op library.
lib_dir, lib_name = tf.sysconfig.get_lib(), None
for flag in tf.sysconfig.get_link_flags():
    if flag.startswith("-L"):
        lib_dir = flag[2:]
    elif flag.startswith("-l:"):
        lib_name = flag[3:]
    elif flag.startswith("-l"):
        lib_name = f"lib{flag[2:]}.so"
emit("TF", tf.sysconfig.get_include(), os.path.join(lib_dir, lib_name),
     [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")], tf.__version__)

# MKL: mkl.h from mkl-include, the single dynamic library libmkl_rt from mkl, the same as setup.py (WORKSPACE has
# Bazel link it where the wheel put it).
try:
    mkl_include_dir, mkl_library = setup.mkl_paths()
except (ModuleNotFoundError, FileNotFoundError) as e:
    sys.exit(f"{e}, or set PYTHON=/path/to/python")
emit("BLAS", mkl_include_dir, mkl_library, [], metadata.version("mkl"))
PY
)" || die "$python_bin cannot provide the wheels the build needs: $(tail -n 3 "$stderr_log")"

declare -A wheel
while IFS='=' read -r key value; do wheel[$key]="$value"; done <<<"$wheel_config"
for prefix in TF BLAS; do
  [[ -f "${wheel[${prefix}_SHARED_LIBRARY]}" ]] || die "${wheel[${prefix}_SHARED_LIBRARY]} does not exist"
done

generated=.bazelrc.generated
{
  echo "# Written by configure.sh for $python_bin (TensorFlow ${wheel[TF_VERSION]}, MKL" \
       "${wheel[BLAS_VERSION]}); do not edit, run ./configure.sh again."
  for command in build query fetch sync; do
    echo "$command --override_repository=\"rules_cc=$WORKSPACE_DIR/third_party/rules_cc\""
    echo "$command --override_repository=\"rules_java=$WORKSPACE_DIR/third_party/rules_java\""
    echo "$command --override_repository=\"platforms=$platforms_dir\""
    for key in $(printf '%s\n' "${!wheel[@]}" | sort); do
      echo "$command --repo_env=\"$key=${wheel[$key]}\""
    done
  done
} >"$generated"
echo "configure.sh: wrote $generated (TensorFlow ${wheel[TF_VERSION]}, MKL ${wheel[BLAS_VERSION]}," \
     "from $python_bin)"
