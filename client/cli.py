"""`bertserve rank`: argv in, exit code out; and the server and tokenizer arguments the load tools share."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from bertserve.client.errors import ServingError
from bertserve.client.padding import PADDING_MODES
from bertserve.client.protocol import ModelSpec
from bertserve.client.retry import RetryPolicy
from bertserve.client.tokenization import PairTokenizer
from bertserve.model_dir import DEFAULT_MAX_LEN, SIGNATURE_NAME

USER_ERRORS = (ValueError, TypeError, FileNotFoundError, TimeoutError, RuntimeError)


def guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, prog: str) -> int:
    """Server errors exit 1 with their TF Serving status; bad input exits 2 with what was wrong."""
    try:
        return run(args)
    except ServingError as error:
        print(f"{prog}: server error {error}", file=sys.stderr)
        return 1
    except USER_ERRORS as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2


def add_server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="localhost:8500",
                        help="host:port of the gRPC port (REST port with --rest); several comma-separated are "
                             "used round robin")
    parser.add_argument("--model", required=True, help="model name as in the server's model config")
    parser.add_argument("--signature", default=SIGNATURE_NAME)
    version = parser.add_mutually_exclusive_group()
    version.add_argument("--version", type=int, help="a version number (default: the latest)")
    version.add_argument("--label", help="a version label, e.g. stable or canary")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request (gRPC deadline)")


def add_tokenizer_args(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--model_dir", help="an exported model version dir: its assets.extra/ gives the vocab, "
                                            "lower-casing and max length the model was trained with")
    parser.add_argument("--vocab", help="a vocab.txt, instead of --model_dir")
    parser.add_argument("--max_len", type=int, help=f"max pair length (default: the model's, or {DEFAULT_MAX_LEN})")
    parser.add_argument("--cased", action="store_true", help="with --vocab: do not lower-case")
    parser.set_defaults(tokenizer_required=required)


def tokenizer_from_args(args: argparse.Namespace) -> PairTokenizer | None:
    if args.model_dir and args.vocab:
        raise ValueError("give --model_dir or --vocab, not both")
    if args.model_dir:
        return PairTokenizer.from_model_dir(args.model_dir, args.max_len)
    if args.vocab:
        return PairTokenizer.from_vocab(args.vocab, args.max_len or DEFAULT_MAX_LEN, lowercase=not args.cased)
    if args.tokenizer_required:
        raise ValueError("the tokenizer is needed: give --model_dir (exported version dir) or --vocab")
    return None


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    return ModelSpec(args.model, args.signature, args.version, args.label)


# ---------------------------------------------------------------------------------------------------- rank

def read_rank_file(path: str) -> list[tuple[str, list[str]]]:
    """A JSON list of {"query", "replies"}, or a text file: first line the query, one reply per further line."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        return [(item["query"], list(item["replies"])) for item in json.loads(text)]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty: expected a query line followed by reply lines")
    return [(lines[0], lines[1:])]


def ranked_table(query: str, ranked) -> str:
    lines = [f"query: {query}", f"{'rank':>4}  {'score':>7}  reply"]
    lines += [f"{i:>4}  {r.score:7.4f}  {r.reply}" for i, r in enumerate(ranked, 1)]
    return "\n".join(lines)


def _run_rank(args: argparse.Namespace) -> int:
    from bertserve.client.ranker import ClientOptions, RankerClient

    if args.file:
        if args.texts:
            raise ValueError("give the query and replies as arguments or with --file, not both")
        items = read_rank_file(args.file)
    elif len(args.texts) >= 2:
        items = [(args.texts[0], args.texts[1:])]
    else:
        raise ValueError('give a query and at least one reply: bertserve rank ... "query" "reply 1" "reply 2"')
    options = ClientOptions(signature=args.signature, version=args.version, version_label=args.label,
                            timeout_s=args.timeout, retry=RetryPolicy(max_retries=args.retries),
                            max_pairs_per_request=args.max_pairs_per_request, padding=args.padding,
                            transport="rest" if args.rest else "grpc")
    with RankerClient(args.target, args.model, tokenizer_from_args(args), options) as client:
        for n, (query, replies) in enumerate(items):
            if n:
                print()
            print(ranked_table(query, client.rank(query, replies)))
        t = client.truncation
        if t.replies_truncated or t.queries_truncated:
            print(f"\nnote: {t.replies_truncated} replies and {t.queries_truncated} queries of {t.pairs} pairs "
                  f"were truncated to {client.tokenizer.max_len} tokens")
    return 0


def rank_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bertserve rank", description="Rank candidate replies for a query.")
    add_server_args(parser)
    add_tokenizer_args(parser, required=True)
    parser.add_argument("--file", help="queries and replies from a file (JSON list or query-then-replies text)")
    parser.add_argument("--rest", action="store_true", help="use the REST API (--target is then the REST port)")
    parser.add_argument("--padding", choices=PADDING_MODES, default="fixed",
                        help="fixed: pad to max_len (needed with batching); bucketed: 8/16/32 (no batching)")
    parser.add_argument("--max_pairs_per_request", type=int, default=32)
    parser.add_argument("--retries", type=int, default=3, help="retries on UNAVAILABLE, with backoff")
    parser.add_argument("texts", nargs="*", help="the query, then the replies")
    return guarded(_run_rank, parser.parse_args(list(argv)), parser.prog)
