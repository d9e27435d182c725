"""Whether the op library in bazel-bin was built from the sources in the tree: tests/build compares that artifact
and does not rebuild it (`make bazel` does), so a stale one must stop the comparison instead of passing it."""

from __future__ import annotations

import subprocess
from pathlib import Path

BAZEL_TARGETS = "//custom_ops:all"
# What the Bazel build of BAZEL_TARGETS reads, relative to the workspace root: the op sources and BUILD files, the
# workspace's rules, and the flags (configure.sh writes .bazelrc.generated). Wider than the BUILD globs (CUDA files
# too): a newer file here only makes Bazel itself check.
INPUT_PATTERNS = ("custom_ops/**/*.cc", "custom_ops/**/*.h", "custom_ops/**/BUILD", "WORKSPACE", ".bazelrc",
                  ".bazelrc.generated", "third_party/**/*.bzl", "third_party/**/BUILD")


def newer_inputs(artifact: Path, root: Path, patterns: tuple[str, ...] = INPUT_PATTERNS) -> list[Path]:
    """The files under root matching patterns that were modified after artifact, sorted."""
    built = artifact.stat().st_mtime_ns
    return sorted({path for pattern in patterns for path in root.glob(pattern)
                   if path.is_file() and path.stat().st_mtime_ns > built})


def stale_reason(artifact: Path, root: Path, patterns: tuple[str, ...] = INPUT_PATTERNS) -> str | None:
    """None if artifact is current, else what is newer and how to rebuild.

    A newer input alone does not prove it stale: Bazel reruns only actions whose inputs' contents changed and
    leaves an output alone when it comes out the same (a touched file, an edited comment), so its time stays old.
    Then `bazel build --check_up_to_date` (which builds nothing) decides.
    """
    newer = newer_inputs(artifact, root, patterns)
    if not newer:
        return None
    names = ", ".join(str(path.relative_to(root)) for path in newer[:5]) + (" ..." if len(newer) > 5 else "")
    try:
        check = subprocess.run(["bazel", "build", "--check_up_to_date", BAZEL_TARGETS], cwd=root,
                               capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        return f"{artifact} is older than {names} and no `bazel` is on PATH to check it: run `make bazel`"
    if check.returncode == 0:
        return None
    errors = [line for line in check.stderr.splitlines() if line.startswith("ERROR")]
    return (f"{artifact} is older than {names} and `bazel build --check_up_to_date {BAZEL_TARGETS}` reports it out "
            f"of date ({errors[0] if errors else check.stderr.strip()[-300:]}): run `make bazel`")
