"""The served ranker that tests/client, tests/loadtest and tests/train share: the recipe's MiniLM, fine-tuned,
exported and served by a real `bertserve serve` once for the whole session, started only by a test that asks.

Fine-tuning is shortened (TRAIN_STEPS, about 40 s on 2 idle cores; capped in time on a busy machine) to fit the
test budget; tests/train/test_recipe.py checks that even this short run ranks far better than chance. Imports are
inside the fixture, so that test folders which never ask for it do not load the client and the server launcher.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from bertserve.client.tokenization import PairTokenizer
    from bertserve.loadtest.server_process import ServerProcess

TRAIN_STEPS = 80
TRAIN_MAX_SECONDS = 180.0
# Room for a few 20-row requests per batch, a short wait so concurrent requests merge.
BATCHING = dict(max_batch_size=64, batch_timeout_micros=2_000, num_batch_threads=2)


@dataclasses.dataclass
class ServedRanker:
    server: ServerProcess
    tokenizer: PairTokenizer
    version_dir: str
    model_config_file: str
    variant: str


@pytest.fixture(scope="session")
def served_ranker(tmp_path_factory) -> ServedRanker:
    from bertserve.client.tokenization import PairTokenizer
    from bertserve.loadtest.server_process import running_server, write_model_config
    from bertserve.loadtest.tuner import BatchingCandidate
    from bertserve.train import recipe

    work = tmp_path_factory.mktemp("ranker")
    checkpoint = recipe.fine_tune(str(work / "checkpoint"), TRAIN_STEPS, TRAIN_MAX_SECONDS, progress=False)
    base = str(work / "models")
    variant = recipe.export_first_working(checkpoint, base)
    model = recipe.MODEL_NAME
    config = write_model_config(str(work / "models.config"), {model: os.path.join(base, model)})
    batching = work / "batching_parameters.txt"
    batching.write_text(BatchingCandidate(**BATCHING).to_text())
    version_dir = os.path.join(base, model, "1")
    with running_server(config, [model], str(work / "serve.log"), batching_parameters_file=str(batching)) as server:
        yield ServedRanker(server, PairTokenizer.from_model_dir(version_dir), version_dir, config, variant)
