"""PyTorch models of the GPU harness: the float32 reference the core is checked against (padded and masked, so
padded keys get exactly zero probability; TF32 off), the Hugging Face model that cross-checks that reference,
and the fp16 baselines the core is timed against (HF BertForSequenceClassification with SDPA attention, and a
hand-written SDPA ranker, HandRanker)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def reference_embedding(w: Mapping[str, torch.Tensor], config: Mapping[str, float], ids: torch.Tensor,
                        segments: torch.Tensor) -> torch.Tensor:
    """float32 embedding + LayerNorm of padded ids [B, S] -> [B, S, H]."""
    s, h = ids.shape[1], int(config["hidden_size"])
    x = w["word_embeddings"][ids] + w["position_embeddings"][:s][None] + w["token_type_embeddings"][segments]
    return F.layer_norm(x, (h,), w["embeddings_ln_gamma"], w["embeddings_ln_beta"], float(config["layer_norm_eps"]))


def reference_encoder(w: Mapping[str, torch.Tensor], config: Mapping[str, float], x: torch.Tensor,
                      lengths: np.ndarray) -> torch.Tensor:
    """float32 encoder layers over padded x [B, S, H] whose row b has lengths[b] real tokens -> [B, S, H]."""
    b, s, h = x.shape
    heads, eps = int(config["num_attention_heads"]), float(config["layer_norm_eps"])
    d = h // heads
    real = torch.arange(s, device=x.device)[None, :] < torch.as_tensor(lengths, device=x.device)[:, None]
    bias = torch.zeros(b, 1, 1, s, device=x.device).masked_fill(~real[:, None, None, :], float("-inf"))
    for l in range(int(config["num_hidden_layers"])):
        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, heads, d).transpose(1, 2)
        q = split(x @ w["query_kernel"][l] + w["query_bias"][l])
        k = split(x @ w["key_kernel"][l] + w["key_bias"][l])
        v = split(x @ w["value_kernel"][l] + w["value_bias"][l])
        scores = q @ k.transpose(-1, -2) / d ** 0.5 + bias
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows of length 0 are all -inf
        ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
        x = F.layer_norm(ctx @ w["attention_output_kernel"][l] + w["attention_output_bias"][l] + x, (h,),
                         w["attention_ln_gamma"][l], w["attention_ln_beta"][l], eps)
        ffn = F.gelu(x @ w["intermediate_kernel"][l] + w["intermediate_bias"][l])
        x = F.layer_norm(ffn @ w["output_kernel"][l] + w["output_bias"][l] + x, (h,), w["output_ln_gamma"][l],
                         w["output_ln_beta"][l], eps)
    return x


def reference_forward(w: Mapping[str, torch.Tensor], config: Mapping[str, float], ids: torch.Tensor,
                      segments: torch.Tensor, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ranker on BertWeights-named tensors -> (packed final hidden [N, H], scores [B]).
    A row of length 0 scores from a zero first-token state, as the op contract says."""
    s = ids.shape[1]
    lens = torch.as_tensor(lengths, device=ids.device)
    real = torch.arange(s, device=ids.device)[None, :] < lens[:, None]  # [B, S]
    x = reference_encoder(w, config, reference_embedding(w, config, ids, segments), lengths)
    first = torch.where(lens[:, None] > 0, x[:, 0], torch.zeros_like(x[:, 0]))
    logits = torch.tanh(first @ w["pooler_kernel"] + w["pooler_bias"]) @ w["classifier_kernel"] + w["classifier_bias"]
    score = torch.sigmoid(logits[:, 0]) if logits.shape[1] == 1 else torch.softmax(logits, dim=1)[:, 1]
    return x[real], score


def hf_config(config: Mapping[str, float], attn_implementation: str):
    from transformers import BertConfig
    return BertConfig(vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
                      num_hidden_layers=int(config["num_hidden_layers"]),
                      num_attention_heads=int(config["num_attention_heads"]),
                      intermediate_size=int(config["intermediate_size"]),
                      max_position_embeddings=int(config["max_position_embeddings"]),
                      type_vocab_size=int(config["type_vocab_size"]), layer_norm_eps=float(config["layer_norm_eps"]),
                      num_labels=int(config["num_labels"]), attn_implementation=attn_implementation)


def hf_ranker(config: Mapping[str, float], w: Mapping[str, torch.Tensor] | None, attn_implementation: str):
    """BertForSequenceClassification on the GPU; with w, loaded from BertWeights-named tensors
    ([in, out] -> [out, in])."""
    from transformers import BertForSequenceClassification
    model = BertForSequenceClassification(hf_config(config, attn_implementation)).cuda().eval()
    if w is None:
        return model
    state = {
        "bert.embeddings.word_embeddings.weight": w["word_embeddings"],
        "bert.embeddings.position_embeddings.weight": w["position_embeddings"],
        "bert.embeddings.token_type_embeddings.weight": w["token_type_embeddings"],
        "bert.embeddings.LayerNorm.weight": w["embeddings_ln_gamma"],
        "bert.embeddings.LayerNorm.bias": w["embeddings_ln_beta"],
        "bert.pooler.dense.weight": w["pooler_kernel"].T, "bert.pooler.dense.bias": w["pooler_bias"],
        "classifier.weight": w["classifier_kernel"].T, "classifier.bias": w["classifier_bias"],
    }
    per_layer = {"attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
                 "attention.output.dense": "attention_output", "intermediate.dense": "intermediate",
                 "output.dense": "output"}
    for l in range(int(config["num_hidden_layers"])):
        p = f"bert.encoder.layer.{l}."
        for hf_name, ours in per_layer.items():
            state[p + hf_name + ".weight"] = w[ours + "_kernel"][l].T
            state[p + hf_name + ".bias"] = w[ours + "_bias"][l]
        for hf_name, ours in (("attention.output.LayerNorm", "attention_ln"), ("output.LayerNorm", "output_ln")):
            state[p + hf_name + ".weight"] = w[ours + "_gamma"][l]
            state[p + hf_name + ".bias"] = w[ours + "_beta"][l]
    missing, unexpected = model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    if unexpected or [m for m in missing if "position_ids" not in m]:
        raise RuntimeError(f"HF state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


class _HandLayer(nn.Module):
    def __init__(self, h: int, heads: int, inter: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.o, self.ln1 = nn.Linear(h, 3 * h), nn.Linear(h, h), nn.LayerNorm(h)
        self.f1, self.f2, self.ln2 = nn.Linear(h, inter), nn.Linear(inter, h), nn.LayerNorm(h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, s, h)))
        return self.ln2(x + self.f2(F.gelu(self.f1(x))))


class HandRanker(nn.Module):
    """The hand-written SDPA ranker of the baseline script (padded, boolean key mask)."""

    def __init__(self, config: Mapping[str, float]):
        super().__init__()
        h, v = int(config["hidden_size"]), int(config["vocab_size"])
        self.emb, self.pos, self.typ = nn.Embedding(v, h), nn.Embedding(512, h), nn.Embedding(2, h)
        self.ln = nn.LayerNorm(h)
        self.layers = nn.ModuleList([_HandLayer(h, int(config["num_attention_heads"]), int(config["intermediate_size"]))
                                     for _ in range(int(config["num_hidden_layers"]))])
        self.pool, self.cls = nn.Linear(h, h), nn.Linear(h, 1)

    def forward(self, ids: torch.Tensor, seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.emb(ids) + self.pos.weight[: ids.shape[1]] + self.typ(seg))
        m = mask[:, None, None, :].to(torch.bool)
        for layer in self.layers:
            x = layer(x, m)
        return torch.sigmoid(self.cls(torch.tanh(self.pool(x[:, 0])))).squeeze(-1)
