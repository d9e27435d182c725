"""@bertserve_tensorflow from the pip TensorFlow package: its headers, libtensorflow_framework and compile flags.

configure.sh reads tf.sysconfig and passes the values as --repo_env; a change in any of them (another
interpreter, another TensorFlow) makes Bazel re-create this repository.
"""

_ENV_HEADER_DIR = "TF_HEADER_DIR"
_ENV_SHARED_LIBRARY = "TF_SHARED_LIBRARY"
_ENV_CXXFLAGS = "TF_CXXFLAGS"
_ENV_VERSION = "TF_VERSION"

_BUILD = """\
package(default_visibility = ["//visibility:public"])

exports_files(["build_defs.bzl"])

# Headers, plus the framework library the op library links against (and finds loaded at run time).
cc_library(
    name = "tensorflow",
    srcs = ["{library}"],
    hdrs = glob(["include/**"], exclude = ["include/**/LICENSE", "include/**/*.txt", "include/**/*.md"]),
    includes = ["include"],
)
"""

_BUILD_DEFS = """\
\"\"\"Compile flags of the pip TensorFlow {version} (tf.sysconfig.get_compile_flags() without -I).\"\"\"

TF_VERSION = "{version}"
TF_COPTS = {copts}
"""

def _required_env(repository_ctx, name):
    value = repository_ctx.os.environ.get(name, "")
    if not value:
        fail("%s is not set: run ./configure.sh in the workspace root first (it writes .bazelrc.generated)." % name)
    return value

def _tf_configure_impl(repository_ctx):
    header_dir = _required_env(repository_ctx, _ENV_HEADER_DIR)
    library = repository_ctx.path(_required_env(repository_ctx, _ENV_SHARED_LIBRARY))
    copts = _required_env(repository_ctx, _ENV_CXXFLAGS).split(" ")
    version = _required_env(repository_ctx, _ENV_VERSION)
    if not library.exists:
        fail("%s=%s does not exist: run ./configure.sh again." % (_ENV_SHARED_LIBRARY, library))

    repository_ctx.symlink(header_dir, "include")
    repository_ctx.symlink(library, library.basename)
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    repository_ctx.file("BUILD", _BUILD.format(library = library.basename))
    repository_ctx.file("build_defs.bzl", _BUILD_DEFS.format(
        version = version,
        copts = repr([c for c in copts if c]),
    ))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = [_ENV_HEADER_DIR, _ENV_SHARED_LIBRARY, _ENV_CXXFLAGS, _ENV_VERSION],
    local = True,
)
