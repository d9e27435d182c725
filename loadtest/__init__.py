"""Load tools around a running server: the load generator and QPS sweep (loadgen, sweep, report), the batching
tuner (tuner), the one `bertserve serve` launcher (server_process) and their CLI (cli). See README.md here."""
