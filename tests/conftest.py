"""One fine-tuned, exported MiniLM ranker served by a real `bertserve serve` for the whole client test session.

Fine-tuning is shortened (TRAIN_STEPS, about 40 s on 2 idle cores; capped in time on a busy machine) to fit the
test budget; the held-out metric test checks that even this short run ranks far better than chance.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from bertserve.client.server_process import ServerProcess, running_server, write_model_config
from bertserve.client.tokenization import PairTokenizer
from bertserve.client.tuner import BatchingCandidate
from bertserve.train import recipe

TRAIN_STEPS = 80
TRAIN_MAX_SECONDS = 180.0
MODEL = recipe.MODEL_NAME
# Room for a few 20-row requests per batch, a short wait so concurrent requests merge.
BATCHING = BatchingCandidate(max_batch_size=64, batch_timeout_micros=2_000, num_batch_threads=2)


@dataclasses.dataclass
class ServedRanker:
    server: ServerProcess
    tokenizer: PairTokenizer
    version_dir: str
    model_config_file: str
    variant: str


@pytest.fixture(scope="session")
def served_ranker(tmp_path_factory) -> ServedRanker:
    work = tmp_path_factory.mktemp("ranker")
    checkpoint = recipe.fine_tune(str(work / "checkpoint"), TRAIN_STEPS, TRAIN_MAX_SECONDS, progress=False)
    base = str(work / "models")
    variant = recipe.export_first_working(checkpoint, base)
    config = write_model_config(str(work / "models.config"), {MODEL: os.path.join(base, MODEL)})
    batching = work / "batching_parameters.txt"
    batching.write_text(BATCHING.to_text())
    version_dir = os.path.join(base, MODEL, "1")
    with running_server(config, [MODEL], str(work / "serve.log"), batching_parameters_file=str(batching)) as server:
        yield ServedRanker(server, PairTokenizer.from_model_dir(version_dir), version_dir, config, variant)
