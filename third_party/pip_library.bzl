"""A C++ library taken from an installed pip wheel: its headers, its shared library and its compile flags.

configure.sh reads them from the wheel (tf.sysconfig for TensorFlow, setup.py's mkl_paths for the mkl and
mkl-include wheels) and passes them as --repo_env <PREFIX>_*; a change in any of them (another interpreter,
another version) makes Bazel create the repository again. Nothing is downloaded.

link_from_wheel = True links the library where the wheel put it (-L, -l:, rpath) instead of through Bazel's own
copy of it: MKL's libmkl_rt loads its CPU-specific libraries from the folder it was itself loaded from, which
must therefore be the wheel's.

The repository holds:
  //:<target_name>     cc_library: the headers (include path set) and the shared library to link;
  //:build_defs.bzl    COPTS: the wheel's compile flags other than -I, for the code that uses it; VERSION.
"""

_SUFFIXES = ["HEADER_DIR", "SHARED_LIBRARY", "COPTS", "VERSION"]
_PREFIXES = ["TF", "BLAS"]

_BUILD = """\
package(default_visibility = ["//visibility:public"])

exports_files(["build_defs.bzl"])

# include/external/ (headers of TensorFlow's dependencies as laid out in its build tree: half of its ~18,000
# files) is left out: no header includes a path starting with external/, and each declared header costs time.
cc_library(
    name = "{target_name}",
    srcs = {srcs},
    hdrs = glob(
        ["include/**"],
        exclude = ["include/external/**", "include/**/LICENSE", "include/**/*.txt", "include/**/*.md"],
    ),
    includes = ["include"],
    linkopts = {linkopts},
)
"""

_BUILD_DEFS = """\
\"\"\"Compile flags of {description} {version}, as the wheel reports them (without -I).\"\"\"

VERSION = "{version}"
COPTS = {copts}
"""

def _env(repository_ctx, suffix, required = True):
    name = "%s_%s" % (repository_ctx.attr.env_prefix, suffix)
    value = repository_ctx.os.environ.get(name, "")
    if required and not value:
        fail("%s is not set: run ./configure.sh in the workspace root first (it writes .bazelrc.generated)." % name)
    return value

def _flags(value):
    return [flag for flag in value.split(" ") if flag]

def _pip_library_impl(repository_ctx):
    library = repository_ctx.path(_env(repository_ctx, "SHARED_LIBRARY"))
    if not library.exists:
        fail("%s does not exist: run ./configure.sh again." % library)
    version = _env(repository_ctx, "VERSION")

    repository_ctx.symlink(_env(repository_ctx, "HEADER_DIR"), "include")
    if repository_ctx.attr.link_from_wheel:
        srcs = []
        linkopts = ["-L%s" % library.dirname, "-l:%s" % library.basename, "-Wl,-rpath,%s" % library.dirname]
    else:
        srcs = [library.basename]
        linkopts = []
        repository_ctx.symlink(library, library.basename)
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    repository_ctx.file("BUILD", _BUILD.format(
        target_name = repository_ctx.attr.target_name,
        srcs = repr(srcs),
        linkopts = repr(linkopts),
    ))
    repository_ctx.file("build_defs.bzl", _BUILD_DEFS.format(
        description = repository_ctx.attr.description,
        version = version,
        copts = repr(_flags(_env(repository_ctx, "COPTS", required = False))),
    ))

pip_library = repository_rule(
    implementation = _pip_library_impl,
    attrs = {
        "env_prefix": attr.string(mandatory = True, values = _PREFIXES),
        "target_name": attr.string(mandatory = True),
        "description": attr.string(mandatory = True),
        "link_from_wheel": attr.bool(
            default = False,
            doc = "Link the shared library in the wheel's folder (with an rpath to it), not a copy in this repository.",
        ),
    },
    environ = ["%s_%s" % (prefix, suffix) for prefix in _PREFIXES for suffix in _SUFFIXES],
    local = True,
)
