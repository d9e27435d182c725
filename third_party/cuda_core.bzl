"""@bertserve_cuda: the CUDA core as build.sh packs it (libbertserve_cuda_core.a) and the CUDA 13 headers.

TF Serving's Bazel CUDA toolchain cannot compile the core (CUDA 13, CUTLASS sm_90a), so the core is built outside
Bazel (`make gpu-ops`, or custom_ops/kernels/cuda/build.sh) and imported here; //custom_ops/gpu compiles the TF
GPU kernels against it with the build's own compiler and flags. Nothing is fetched unless a target of
//custom_ops/gpu is built, so CPU-only builds need neither the archive nor CUDA.

  BERTSERVE_CUDA_CORE  the archive, an absolute path (default: build/cuda/libbertserve_cuda_core.a in the bertserve
                       checkout)
  BERTSERVE_CUDA_HOME  the CUDA 13 toolkit the core was built with, for its headers (default /usr/local/cuda; not
                       CUDA_HOME, which a TF Serving GPU image may point at its own CUDA 12)

The repository holds //:core (the archive) and //:cuda_headers (cuda_runtime.h, cuda_fp16.h and what they include;
the CCCL libraries under include/ are left out: the kernels include none of them).
"""

_BUILD = """\
package(default_visibility = ["//visibility:public"])

cc_import(
    name = "core",
    static_library = "libbertserve_cuda_core.a",
)

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**", "include/nv/**"]),
    includes = ["include"],
)
"""

def _cuda_core_repository_impl(repository_ctx):
    checkout = repository_ctx.path(Label("//:WORKSPACE")).dirname
    archive = repository_ctx.path(repository_ctx.os.environ.get(
        "BERTSERVE_CUDA_CORE",
        "%s/build/cuda/libbertserve_cuda_core.a" % checkout,
    ))
    if not archive.exists:
        fail(("%s does not exist: build the CUDA core first (`make gpu-ops`, or " +
              "custom_ops/kernels/cuda/build.sh OUT_DIR), or set BERTSERVE_CUDA_CORE to its " +
              "libbertserve_cuda_core.a (--repo_env=BERTSERVE_CUDA_CORE=...).") % archive)
    cuda_home = repository_ctx.os.environ.get("BERTSERVE_CUDA_HOME", "/usr/local/cuda")
    cuda_include = repository_ctx.path("%s/include" % cuda_home)
    if not cuda_include.get_child("cuda_runtime.h").exists:
        fail("%s/cuda_runtime.h does not exist: set BERTSERVE_CUDA_HOME to the CUDA 13 toolkit." %
             cuda_include)
    repository_ctx.symlink(archive, "libbertserve_cuda_core.a")
    repository_ctx.symlink(cuda_include, "include")
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    repository_ctx.file("BUILD", _BUILD)

cuda_core_repository = repository_rule(
    implementation = _cuda_core_repository_impl,
    environ = ["BERTSERVE_CUDA_CORE", "BERTSERVE_CUDA_HOME"],
    local = True,
)
