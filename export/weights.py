"""BertWeights: the one in-memory form of a BERT ranker that every loader produces and every builder consumes.

Arrays use TensorFlow's layout ([in, out] kernels); per-layer arrays are stacked on a leading layer axis;
q/k/v stay apart (graph builders fuse them). Keeping one plain object here is what lets loaders, graph
builders, the float64 reference and the benchmarks agree without knowing about each other.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

SUPPORTED_ACTIVATIONS = ("gelu",)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    num_labels: int = 1

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self) -> None:
        """Raises ValueError naming the first field that no builder can serve."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (supported: {SUPPORTED_ACTIVATIONS})")
        if self.num_labels not in (1, 2):
            raise ValueError(f"num_labels {self.num_labels} is not supported: a ranker head has 1 or 2 labels")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


# The per-layer arrays, stacked on a leading layer axis, in canonical order.
LAYER_ARRAY_NAMES = (
    "query_kernel", "query_bias", "key_kernel", "key_bias", "value_kernel", "value_bias",
    "attention_output_kernel", "attention_output_bias", "attention_ln_gamma", "attention_ln_beta",
    "intermediate_kernel", "intermediate_bias", "output_kernel", "output_bias", "output_ln_gamma", "output_ln_beta",
)


# name -> shape as a function of the config; the order is the canonical order used everywhere.
def expected_shapes(c: BertConfig) -> dict[str, tuple[int, ...]]:
    L, H, I = c.num_hidden_layers, c.hidden_size, c.intermediate_size
    return {
        "word_embeddings": (c.vocab_size, H),
        "position_embeddings": (c.max_position_embeddings, H),
        "token_type_embeddings": (c.type_vocab_size, H),
        "embeddings_ln_gamma": (H,),
        "embeddings_ln_beta": (H,),
        "query_kernel": (L, H, H),
        "query_bias": (L, H),
        "key_kernel": (L, H, H),
        "key_bias": (L, H),
        "value_kernel": (L, H, H),
        "value_bias": (L, H),
        "attention_output_kernel": (L, H, H),
        "attention_output_bias": (L, H),
        "attention_ln_gamma": (L, H),
        "attention_ln_beta": (L, H),
        "intermediate_kernel": (L, H, I),
        "intermediate_bias": (L, I),
        "output_kernel": (L, I, H),
        "output_bias": (L, H),
        "output_ln_gamma": (L, H),
        "output_ln_beta": (L, H),
        "pooler_kernel": (H, H),
        "pooler_bias": (H,),
        "classifier_kernel": (H, c.num_labels),
        "classifier_bias": (c.num_labels,),
    }


@dataclasses.dataclass
class BertWeights:
    """A BERT ranker: config plus float32 arrays keyed by the names of `expected_shapes`."""

    config: BertConfig
    arrays: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        self.config.validate()
        shapes = expected_shapes(self.config)
        missing = [n for n in shapes if n not in self.arrays]
        if missing:
            raise ValueError(f"BertWeights is missing arrays: {', '.join(missing)}")
        unknown = [n for n in self.arrays if n not in shapes]
        if unknown:
            raise ValueError(f"BertWeights got unknown arrays: {', '.join(unknown)}")
        for name, shape in shapes.items():
            if tuple(self.arrays[name].shape) != shape:
                raise ValueError(f"{name}: shape {tuple(self.arrays[name].shape)} does not match expected {shape}")
            self.arrays[name] = np.ascontiguousarray(self.arrays[name], dtype=np.float32)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        return iter(self.arrays.items())

    @classmethod
    def random(cls, config: BertConfig, seed: int = 0, scale: float = 0.05) -> "BertWeights":
        """Seeded random weights with LayerNorm gammas near 1: realistic magnitudes for tests and benchmarks."""
        rng = np.random.default_rng(seed)
        arrays: dict[str, np.ndarray] = {}
        for name, shape in expected_shapes(config).items():
            if name.endswith("ln_gamma"):
                arrays[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            else:
                arrays[name] = scale * rng.standard_normal(shape)
        return cls(config, arrays)


CHITCHAT_CONFIG = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                             intermediate_size=3072, max_position_embeddings=512)
