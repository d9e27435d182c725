# Source from the repository root on the GPU machine: `source gpu_rig/env.sh`.
# The one way the harness, tests/gpu and the rig import the project there: the device's Python 3.12 has no
# editable install of bertserve, so a link named `bertserve` to the checkout goes first on PYTHONPATH (on the
# development machine `make setup`'s editable install does the same job). Where gpu_rig/device.sh has installed
# TensorFlow (/tmp/bertserve_rig), its site folder, the CUDA 12 library names, the op libraries and the carried
# reference data are exported too.
BERTSERVE_ROOT=$(pwd)
BERTSERVE_PYROOT=/tmp/bertserve_pyroot
mkdir -p "$BERTSERVE_PYROOT"
ln -sfn "$BERTSERVE_ROOT" "$BERTSERVE_PYROOT/bertserve"
export PYTHONPATH="$BERTSERVE_PYROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
BERTSERVE_RIG=/tmp/bertserve_rig
if [[ -d $BERTSERVE_RIG/site ]]; then
  export PYTHONPATH="$PYTHONPATH:$BERTSERVE_RIG/site"
  export LD_LIBRARY_PATH="$BERTSERVE_RIG/cuda12_names:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The registration library (bert_ops.cc and its input checks, no CPU kernels: MKL is not on the GPU machine)
  # with the TF GPU kernels beside it.
  export BERTSERVE_OPS_LIBRARY=$BERTSERVE_RIG/ops/_bert_ops.so
  export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
fi
[[ -d $BERTSERVE_RIG/reference ]] && export BERTSERVE_GPU_REFERENCE=$BERTSERVE_RIG/reference
true
