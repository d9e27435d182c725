"""What application engineers touch: pair tokenization (tokenization), client-side padding (padding), Predict over
gRPC or REST (protocol, transport, retry, errors), the ranking API (ranker), the load generator and QPS sweep
(loadgen, sweep, report), the batching tuner (tuner, server_process), the CLI (cli) and `make demo` (demo).
See README.md in this folder."""
