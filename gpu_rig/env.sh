# Source from the repository root on the GPU machine: `source gpu_rig/env.sh`.
# The one way the harness, tests/gpu and the rig import the project there: the device's Python 3.12 has no
# editable install of bertserve, so a link named `bertserve` to the checkout goes first on PYTHONPATH (on the
# development machine `make setup`'s editable install does the same job). Later stages of the rig add
# TensorFlow's site folder and library paths here.
BERTSERVE_ROOT=$(pwd)
BERTSERVE_PYROOT=/tmp/bertserve_pyroot
mkdir -p "$BERTSERVE_PYROOT"
ln -sfn "$BERTSERVE_ROOT" "$BERTSERVE_PYROOT/bertserve"
export PYTHONPATH="$BERTSERVE_PYROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
