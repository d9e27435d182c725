"""The stale-build detection of bazel_freshness on small trees whose file times are set explicitly."""

from __future__ import annotations

import os
from pathlib import Path

from bazel_freshness import newer_inputs, stale_reason

BUILT_NS = 1_700_000_000 * 10**9


def write(root: Path, relative: str, mtime_ns: int) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(relative)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def source_tree(root: Path, sources_mtime_ns: int) -> Path:
    """A workspace-shaped tree (no WORKSPACE file, so no Bazel server starts in it) and its artifact."""
    for relative in ("custom_ops/BUILD", "custom_ops/kernels/encoder.cc", "custom_ops/kernels/encoder.h",
                     "custom_ops/tf/ops.cc", "third_party/pip_library.bzl", "custom_ops/README.md"):
        write(root, relative, sources_mtime_ns)
    return write(root, "bazel-bin/custom_ops/_bert_ops.so", BUILT_NS)


def test_sources_older_than_the_artifact_are_current(tmp_path):
    artifact = source_tree(tmp_path, BUILT_NS - 10**9)
    assert newer_inputs(artifact, tmp_path) == []
    assert stale_reason(artifact, tmp_path) is None


def test_each_kind_of_input_newer_than_the_artifact_is_found(tmp_path):
    artifact = source_tree(tmp_path, BUILT_NS - 10**9)
    newer = [write(tmp_path, relative, BUILT_NS + 1) for relative in
             ("custom_ops/kernels/encoder.h", "custom_ops/tf/ops.cc", "custom_ops/BUILD", ".bazelrc.generated",
              "third_party/pip_library.bzl")]
    write(tmp_path, "custom_ops/README.md", BUILT_NS + 1)  # not read by the build
    assert newer_inputs(artifact, tmp_path) == sorted(newer)


def test_a_newer_source_that_bazel_cannot_confirm_current_names_the_file_and_the_fix(tmp_path):
    artifact = source_tree(tmp_path, BUILT_NS - 10**9)
    write(tmp_path, "custom_ops/kernels/encoder.cc", BUILT_NS + 1)
    reason = stale_reason(artifact, tmp_path)
    assert reason is not None
    assert "custom_ops/kernels/encoder.cc" in reason and "make bazel" in reason
