"""The system OpenBLAS needs no extra compile flags."""

VERSION = "the system OpenBLAS"
COPTS = []
