"""Intel MKL from the mkl / mkl-include wheels installed under /opt/mkl (see BUILD)."""

VERSION = "Intel MKL 2026.2.0 from PyPI, under /opt/mkl"
COPTS = ["-isystem", "/opt/mkl/include"]
