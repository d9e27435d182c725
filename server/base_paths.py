"""A model's base path as TF Serving's FileSystemStoragePathSource reads it: version directories by their names.

Listing and checks go through TensorFlow's file system API (tf.io.gfile), so a base path may be a local path or
any URI TensorFlow reads (file://, gs://, s3://, hdfs://), by the same code. A child is a version when its whole
name is ASCII decimal digits whose value fits int64 ("00000123" is version 123, read from its own directory);
every other name ("latest", "1.0", "-3", "+3", "²", "١٢", 18446744073709551616) is no version and is skipped
without affecting other names or models.
"""

from __future__ import annotations

import logging
import re

import tensorflow as tf

log = logging.getLogger("bertserve.server")

INT64_MAX = (1 << 63) - 1
# ASCII digits only: str.isdigit() and int() also accept superscripts and other scripts' digits.
_VERSION_NAME = re.compile(r"[0-9]+", re.ASCII)
# scheme://... : a URI that tf.io.gfile resolves through its registered file systems.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_reported_duplicates: set[tuple[str, str]] = set()


def parse_version(name: str) -> int | None:
    """The version a directory name stands for, or None when TF Serving would skip it."""
    if not _VERSION_NAME.fullmatch(name):
        return None
    value = int(name)
    return value if value <= INT64_MAX else None


def is_absolute(base_path: str) -> bool:
    """TF Serving refuses relative base paths; a URI (gs://bucket/model) counts as absolute."""
    return base_path.startswith("/") or bool(_URI.match(base_path))


def join(base_path: str, name: str) -> str:
    """base_path/name for local paths and URIs alike."""
    return base_path.rstrip("/") + "/" + name


def list_version_dirs(base_path: str) -> dict[int, str]:
    """version -> the path of its directory, as named on the file system. Raises OSError when the base path
    cannot be listed (missing, no permission, unknown URI scheme).

    Two names for one version ("7" and "007") are ambiguous: the first in name order is used and the other is
    reported, as neither can be preferred for a reason.
    """
    try:
        children = tf.io.gfile.listdir(base_path)
    except tf.errors.OpError as exc:
        raise OSError(f"Could not list base path {base_path}: {exc.message}") from exc
    found: dict[int, str] = {}
    for child in sorted(name.rstrip("/") for name in children):
        version = parse_version(child)
        if version is None:
            continue
        path = join(base_path, child)
        try:
            if not tf.io.gfile.isdir(path):
                continue
        except tf.errors.OpError:
            continue  # vanished or unreadable between the listing and the check: not a version now
        if version in found:
            if (base_path, child) not in _reported_duplicates:  # once, not on every poll
                _reported_duplicates.add((base_path, child))
                log.warning("base path %s: directories %s and %s are both version %d; using %s", base_path,
                            found[version].rsplit("/", 1)[-1], child, version, found[version].rsplit("/", 1)[-1])
            continue
        found[version] = path
    return found
