"""ctypes driver of the CUDA core's C ABI (custom_ops/c_api/ranker_c_api.cu), with torch owning every
device buffer. One CudaRanker holds the weights, one workspace sized for the largest batch it will see, and
CUDA graphs captured per (batch, token-count bucket): a graph for bucket N serves any batch of that size whose
real token count is <= N, because the core treats packed rows past the real tokens as scratch."""

from __future__ import annotations

import ctypes
from typing import Mapping

import numpy as np
import torch

# Device-pointer order of bertserve_cuda_ranker_create (ranker_c_api.cu WeightIndex).
WEIGHT_ORDER = (
    "word_embeddings", "position_embeddings", "token_type_embeddings", "embeddings_ln_gamma", "embeddings_ln_beta",
    "qkv_kernel", "qkv_bias", "attention_output_kernel", "attention_output_bias", "attention_ln_gamma",
    "attention_ln_beta", "intermediate_kernel", "intermediate_bias", "output_kernel", "output_bias",
    "output_ln_gamma", "output_ln_beta", "pooler_kernel", "pooler_bias", "classifier_kernel", "classifier_bias",
)

_c_int64, _vp, _i32p = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p


def load_library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.bertserve_cuda_last_error.restype = ctypes.c_char_p
    lib.bertserve_cuda_ranker_create.restype = _vp
    lib.bertserve_cuda_ranker_create.argtypes = [ctypes.c_int] * 4 + [_c_int64] * 8 + [ctypes.c_float, _vp]
    lib.bertserve_cuda_ranker_destroy.argtypes = [_vp]
    lib.bertserve_cuda_ranker_describe_plans.restype = ctypes.c_char_p
    lib.bertserve_cuda_ranker_describe_plans.argtypes = [_vp]
    lib.bertserve_cuda_ranker_workspace_bytes.restype = _c_int64
    lib.bertserve_cuda_ranker_workspace_bytes.argtypes = [_vp, _c_int64, _c_int64]
    lib.bertserve_cuda_token_bucket.restype = _c_int64
    lib.bertserve_cuda_token_bucket.argtypes = [_c_int64]
    lib.bertserve_cuda_ranker_forward.argtypes = [_vp, _i32p, _i32p, _c_int64, _c_int64, _i32p, _i32p, _c_int64,
                                                  _c_int64, _vp, _vp, _vp, _vp]
    lib.bertserve_cuda_encoder_forward.argtypes = [_vp, _vp, _c_int64, _i32p, ctypes.c_int, ctypes.c_int, _vp, _vp]
    lib.bertserve_cuda_encoder_graph_count.restype = _c_int64
    lib.bertserve_cuda_encoder_graph_count.argtypes = [_vp]
    lib.bertserve_cuda_remove_padding.argtypes = [ctypes.c_int, _vp, _c_int64, _c_int64, _c_int64, _i32p, _c_int64,
                                                  _vp, _vp]
    lib.bertserve_cuda_rebuild_padding.argtypes = [ctypes.c_int, _vp, _c_int64, _c_int64, _c_int64, _i32p, _vp, _vp]
    return lib


def check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        raise RuntimeError(lib.bertserve_cuda_last_error().decode())


def fuse_qkv(arrays: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BertWeights-named tensors -> the op inputs: qkv = concat(query, key, value) on the last axis."""
    out = {k: v for k, v in arrays.items() if not k.startswith(("query_", "key_", "value_"))}
    out["qkv_kernel"] = torch.cat([arrays["query_kernel"], arrays["key_kernel"], arrays["value_kernel"]], dim=-1)
    out["qkv_bias"] = torch.cat([arrays["query_bias"], arrays["key_bias"], arrays["value_bias"]], dim=-1)
    return out


def cu_seqlens_of(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class CudaRanker:
    """The core's whole ranker forward on fp16 (or float32) weights living on the GPU. autotune and
    custom_gemms are the core's GemmOptions: the harness plans every graph bucket before capture, so it
    can afford to time the GEMM candidates once per shape. first_token_last_layer runs the encoder's last layer
    for each row's first token only (all the pooler reads); off, for every token, so that hidden_out holds the
    encoder's whole output."""

    def __init__(self, lib: ctypes.CDLL, config: Mapping[str, float], weights: Mapping[str, torch.Tensor],
                 dtype: torch.dtype, max_batch: int, seq: int, autotune: bool = True,
                 custom_gemms: bool = True, first_token_last_layer: bool = True):
        self.lib, self.dtype, self.seq, self.max_batch = lib, dtype, seq, max_batch
        self.hidden = int(config["hidden_size"])
        fused = fuse_qkv(weights)
        self.weights = {k: fused[k].to("cuda", dtype).contiguous() for k in WEIGHT_ORDER}
        pointers = (ctypes.c_void_p * len(WEIGHT_ORDER))(*[self.weights[k].data_ptr() for k in WEIGHT_ORDER])
        self.handle = lib.bertserve_cuda_ranker_create(
            int(dtype == torch.float16), int(autotune), int(custom_gemms), int(first_token_last_layer),
            config["vocab_size"], config["hidden_size"], config["num_attention_heads"],
            config["intermediate_size"], config["num_hidden_layers"], config["max_position_embeddings"],
            config["type_vocab_size"], config["num_labels"], float(config["layer_norm_eps"]), pointers)
        if not self.handle:
            raise RuntimeError(lib.bertserve_cuda_last_error().decode())
        max_tokens = self.token_bucket(max_batch * seq)
        nbytes = lib.bertserve_cuda_ranker_workspace_bytes(self.handle, max_tokens, max_batch)
        self.workspace = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")  # allocated once, zeroed once
        # Static input buffers that graphs read; a batch is copied into their leading rows.
        self.ids = torch.zeros(max_batch, seq, dtype=torch.int32, device="cuda")
        self.segments = torch.zeros_like(self.ids)
        self.cu_device = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
        self.cu_host = torch.zeros(max_batch + 1, dtype=torch.int32).pin_memory()
        self.scores = torch.zeros(max_batch, dtype=torch.float32, device="cuda")
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def token_bucket(self, num_tokens: int) -> int:
        """The core's TokenBucket: the token count graphs are captured for and the TF GPU kernel runs at."""
        return int(self.lib.bertserve_cuda_token_bucket(num_tokens))

    def gemm_plans(self) -> list[str]:
        """How each planned fp16 GEMM shape runs (cuBLASLt or a CUTLASS tile configuration; for the FFN GEMM +
        GELU, a CUTLASS kernel with GELU in its epilogue or the GEMM + a GELU pass)."""
        return self.lib.bertserve_cuda_ranker_describe_plans(self.handle).decode().splitlines()

    def close(self) -> None:
        if self.handle:
            self.lib.bertserve_cuda_ranker_destroy(self.handle)
            self.handle = None

    def stage(self, ids: torch.Tensor, segments: torch.Tensor, lengths: np.ndarray) -> int:
        """Copies a batch's inputs into the ranker's buffers (what a graph reads); returns its real token count."""
        b = ids.shape[0]
        self.ids[:b].copy_(ids, non_blocking=True)
        self.segments[:b].copy_(segments, non_blocking=True)
        cu = cu_seqlens_of(lengths)
        self.cu_host[: b + 1] = torch.from_numpy(cu)
        self.cu_device[: b + 1].copy_(self.cu_host[: b + 1])  # blocking: cu_host is reused by the next batch
        return int(cu[-1])

    def launch(self, batch: int, num_tokens: int, hidden_out: torch.Tensor | None = None) -> None:
        """Launches one forward of the staged batch over num_tokens rows (the real count, or a bucket's)."""
        stream = torch.cuda.current_stream().cuda_stream
        check(self.lib, self.lib.bertserve_cuda_ranker_forward(
            self.handle, self.ids.data_ptr(), self.segments.data_ptr(), self.seq, batch, self.cu_host.data_ptr(),
            self.cu_device.data_ptr(), num_tokens, self.seq, self.workspace.data_ptr(),
            None if hidden_out is None else hidden_out.data_ptr(), self.scores.data_ptr(), stream))

    def forward(self, ids: torch.Tensor, segments: torch.Tensor, lengths: np.ndarray,
                hidden_out: torch.Tensor | None = None, bucketed: bool = False) -> torch.Tensor:
        """Eager launches (no graph) over exactly the real tokens, or (bucketed) over token_bucket of them, as the
        TF GPU kernel runs; returns scores [batch] (a view)."""
        b = ids.shape[0]
        n = self.stage(ids, segments, lengths)
        self.launch(b, self.token_bucket(n) if bucketed else n, hidden_out)
        return self.scores[:b]

    def graph_for(self, batch: int, bucket: int) -> torch.cuda.CUDAGraph:
        key = (batch, bucket)
        if key not in self.graphs:
            self.launch(batch, bucket)  # plans the GEMMs outside capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.launch(batch, bucket)
            self.graphs[key] = graph
        return self.graphs[key]

    def forward_graph(self, ids: torch.Tensor, segments: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
        """Replays the (batch, token bucket) graph after staging the inputs; returns scores [batch] (a view)."""
        b = ids.shape[0]
        n = self.stage(ids, segments, lengths)
        self.graph_for(b, self.token_bucket(n)).replay()
        return self.scores[:b]

    def encoder(self, hidden: torch.Tensor, lengths: np.ndarray, first_token_only: bool, graphs: bool) -> torch.Tensor:
        """The encoder alone as the TF GPU kernel runs it (the core's BucketedEncoder, on this ranker's encoder
        weights): hidden [real tokens, H] in, [real tokens, H] or [batch, H] out; graphs replays the core's CUDA graph
        for the (batch, token bucket) pair, captured on its first call, else the same launches one by one."""
        cu = cu_seqlens_of(lengths)
        out = torch.empty((len(lengths) if first_token_only else int(cu[-1]), self.hidden), dtype=self.dtype,
                          device="cuda")
        self.encoder_into(hidden, cu, out, first_token_only, graphs)
        return out

    def encoder_into(self, hidden: torch.Tensor, cu_seqlens: np.ndarray, out: torch.Tensor, first_token_only: bool,
                     graphs: bool) -> None:
        """encoder() on a caller's int32 cu_seqlens and output: the core's call alone, as a benchmark times it."""
        check(self.lib, self.lib.bertserve_cuda_encoder_forward(
            self.handle, hidden.data_ptr(), len(cu_seqlens) - 1, cu_seqlens.ctypes.data, int(first_token_only),
            int(graphs), out.data_ptr(), torch.cuda.current_stream().cuda_stream))

    def encoder_graph_count(self) -> int:
        return int(self.lib.bertserve_cuda_encoder_graph_count(self.handle))
