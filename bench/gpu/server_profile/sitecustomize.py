"""Run by Python at start-up when this folder is on PYTHONPATH: serve_sweep.py puts it on the server's, with
BERTSERVE_STACK_SAMPLES naming the folder stack_sampler.py writes into (SIGUSR1 starts sampling, SIGUSR2 writes).
Without that variable it does nothing."""

import os

if os.environ.get("BERTSERVE_STACK_SAMPLES"):
    from bertserve.bench.gpu.stack_sampler import install

    install(os.environ["BERTSERVE_STACK_SAMPLES"])
