"""bertserve: a TensorFlow Serving extension for batched BERT serving."""

__version__ = "0.1.0"
