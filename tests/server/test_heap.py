"""A loaded version's Python objects are frozen out of the cyclic collector's scans (no full collection over a
TensorFlow graph stalls the requests), and unloading a version still frees them, reference cycles included."""

from __future__ import annotations

import gc
import os
import threading
import weakref

from bertserve.server.config_files import BatchingOptions, single_model_config
from bertserve.server.manager import ManagerOptions, ModelManager
from bertserve.server.metrics import ServerMetrics


def _manager() -> ModelManager:
    return ModelManager(ManagerOptions(
        saved_model_tags=frozenset({"serve"}), enable_model_warmup=False, warmup_iterations=1,
        allow_labels_for_unavailable=False, batching=BatchingOptions(max_batch_size=8)), ServerMetrics(8))


def _tracked(target: object) -> bool:
    """Whether the collector's generations (not the frozen one) hold `target`."""
    return any(candidate is target for candidate in gc.get_objects())


def test_loaded_version_is_frozen_and_freed_when_unloaded(models_dir):
    manager = _manager()
    config = single_model_config("tiny", os.path.join(models_dir, "tiny"))
    manager.apply_config(config)
    manager.load_startup_models(threading.Event())
    try:
        with manager.serving("tiny") as handle:
            assert handle.servable.version == 2
            version_2 = weakref.ref(handle.servable)
            graph_2 = weakref.ref(handle.servable.bundle.session.graph)
        del handle
        assert not _tracked(version_2()), "the loaded version is still scanned by every full collection"
        assert gc.get_freeze_count() > 10_000

        # Serve version 1 instead: version 2 unloads, and nothing of it stays behind frozen in a cycle.
        config.model_config_list.config[0].model_version_policy.specific.versions.append(1)
        manager.apply_config(config)
        manager.poll()
        with manager.serving("tiny") as handle:
            assert handle.servable.version == 1
        del handle
        assert version_2() is None and graph_2() is None, "the unloaded version's objects were not freed"
    finally:
        manager.shutdown()
