"""Errors of the export stages, in a module of their own so that the writers (onnx_export) and the checks
(validate) raise the same error without importing each other."""

from __future__ import annotations


class ValidationError(RuntimeError):
    """An exported file disagrees with the reference beyond tolerance, or is not shaped as the contract says."""
