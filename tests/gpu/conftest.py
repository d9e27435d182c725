"""Fixtures of tests/gpu. The TensorFlow GPU tests (test_tf_gpu_*.py) share the fused variants below, exported once a
session into a temporary folder and loaded on the test device (tf_gpu_testing.py says where they run and how)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def tf_pool():
    """The carried pool of input rows (gpu_rig/reference.py) every TF GPU test draws its batches from."""
    from tf_gpu_testing import carried, reference_dir

    return carried.load_pool(reference_dir())


@pytest.fixture(scope="session")
def tf_served(tmp_path_factory):
    """(model, precision) -> Served: the fused SavedModel exported on this machine (from the carried fp16 MiniLM or
    the chit-chat seed) and loaded on the test device, once a session."""
    from tf_gpu_testing import Served, carried, load_saved_model, reference_dir

    folder = reference_dir()
    scores = carried.load_scores(folder)
    served: dict[tuple[str, str], Served] = {}

    def get(model: str, precision: str) -> Served:
        if (model, precision) not in served:
            base = str(tmp_path_factory.mktemp(f"{model}_{precision}"))
            weights = carried.variant_weights(folder, model, precision)
            path = carried.export_fused(weights, precision, base)
            served[model, precision] = Served(model, precision, weights.config, path, load_saved_model(path),
                                              scores[f"reference_{model}_{precision}"],
                                              scores[f"cpu_{model}_{precision}"])
        return served[model, precision]

    return get
