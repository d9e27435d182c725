"""Inside TensorFlow Serving its own .bazelrc sets the flags TensorFlow is built with (C++17, string ABI)."""

VERSION = "the TensorFlow of the TensorFlow Serving workspace"
COPTS = []
