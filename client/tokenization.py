"""WordPiece pair encoding, exactly as the ranker was trained: [CLS] query [SEP] reply [SEP], segments 0 / 1.

The settings come from the model version's assets.extra/ (written by the export), so a client cannot silently
tokenize differently from training. Truncation keeps the query whole when it can, because the query is what the
ranker judges every reply against: the reply loses tokens first, the query only when it alone does not fit.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from tokenizers import BertWordPieceTokenizer

from bertserve.model_dir import DEFAULT_MAX_LEN, TokenizerSettings

SPECIAL_TOKENS_PER_PAIR = 3  # [CLS] ... [SEP] ... [SEP]


@dataclasses.dataclass
class TruncationStats:
    """How many pairs lost tokens: counted, never silent, because a truncated pair scores differently."""

    pairs: int = 0
    replies_truncated: int = 0
    queries_truncated: int = 0

    def add(self, other: "TruncationStats") -> None:
        self.pairs += other.pairs
        self.replies_truncated += other.replies_truncated
        self.queries_truncated += other.queries_truncated


@dataclasses.dataclass
class EncodedPairs:
    """Unpadded token ids per pair plus the segment boundary (segment 1 starts at `first_segment_len[i]`)."""

    ids: list[list[int]]
    first_segment_len: list[int]
    truncation: TruncationStats


def split_budget(query_len: int, reply_len: int, max_len: int) -> tuple[int, int]:
    """Tokens kept of (query, reply) within max_len: the reply shrinks first; the query only when it alone is
    too long, and then it keeps max_len - 4 tokens so every pair still carries at least one reply token."""
    budget = max_len - SPECIAL_TOKENS_PER_PAIR
    query_keep = min(query_len, budget - min(reply_len, 1))
    reply_keep = min(reply_len, budget - query_keep)
    return query_keep, reply_keep


class PairTokenizer:
    """Encodes (query, reply) pairs for the ranker with Hugging Face `tokenizers` (Rust WordPiece)."""

    def __init__(self, settings: TokenizerSettings):
        if settings.max_seq_length < SPECIAL_TOKENS_PER_PAIR + 2:
            raise ValueError(f"max_seq_length {settings.max_seq_length} leaves no room for a query and a reply")
        if not os.path.isfile(settings.vocab_file):
            raise FileNotFoundError(f"vocab file not found: {settings.vocab_file}")
        self.settings = settings
        self.max_len = settings.max_seq_length
        self._wordpiece = BertWordPieceTokenizer(
            settings.vocab_file, lowercase=settings.do_lower_case,
            handle_chinese_chars=settings.tokenize_chinese_chars)
        self.cls_id = self._required_id("[CLS]")
        self.sep_id = self._required_id("[SEP]")
        self.vocab_size = self._wordpiece.get_vocab_size()

    @classmethod
    def from_model_dir(cls, path: str, max_len: int | None = None) -> "PairTokenizer":
        settings = TokenizerSettings.from_model_dir(path)
        if max_len is not None:
            settings = dataclasses.replace(settings, max_seq_length=max_len)
        return cls(settings)

    @classmethod
    def from_vocab(cls, vocab_file: str, max_len: int = DEFAULT_MAX_LEN, lowercase: bool = True) -> "PairTokenizer":
        return cls(TokenizerSettings(vocab_file=vocab_file, do_lower_case=lowercase, max_seq_length=max_len))

    def _required_id(self, token: str) -> int:
        token_id = self._wordpiece.token_to_id(token)
        if token_id is None:
            raise ValueError(f"vocab {self.settings.vocab_file} has no {token} token")
        return token_id

    def tokens(self, text: str) -> list[str]:
        """WordPiece tokens of one text, without special tokens (for inspection and tests)."""
        return self._wordpiece.encode(text, add_special_tokens=False).tokens

    def encode_pairs(self, queries: Sequence[str], replies: Sequence[str]) -> EncodedPairs:
        """Encodes queries[i] with replies[i]; texts are tokenized once each in one Rust batch call."""
        if len(queries) != len(replies):
            raise ValueError(f"got {len(queries)} queries but {len(replies)} replies")
        unique_queries = list(dict.fromkeys(queries))
        encoded = self._wordpiece.encode_batch(list(unique_queries) + list(replies), add_special_tokens=False)
        query_ids = {q: e.ids for q, e in zip(unique_queries, encoded)}
        reply_ids = [e.ids for e in encoded[len(unique_queries):]]
        stats = TruncationStats(pairs=len(replies))
        ids, first_len = [], []
        for query, reply in zip(queries, reply_ids):
            q = query_ids[query]
            q_keep, r_keep = split_budget(len(q), len(reply), self.max_len)
            stats.queries_truncated += q_keep < len(q)
            stats.replies_truncated += r_keep < len(reply)
            ids.append([self.cls_id, *q[:q_keep], self.sep_id, *reply[:r_keep], self.sep_id])
            first_len.append(q_keep + 2)
        return EncodedPairs(ids=ids, first_segment_len=first_len, truncation=stats)
