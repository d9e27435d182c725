"""What application engineers touch: pair tokenization (tokenization), client-side padding (padding), Predict over
gRPC or REST (protocol, transport, retry, errors), the ranking API (ranker) and `bertserve rank` (cli).
See README.md in this folder."""
