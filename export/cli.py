"""`bertserve export SRC OUT_BASE --model NAME --version N --variant fused|stock --precision fp32|fp16|bf16 ...`

SRC is any format loaders.load_any detects (Google BERT checkpoint, Hugging Face directory, bertserve training
directory). Writes <OUT_BASE>/<NAME>/<N>/ (see saved.py) and, with --onnx, <OUT_BASE>/<NAME>/onnx/<N>/model.onnx.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from tqdm import tqdm

from bertserve.export import loaders
from bertserve.export.errors import ValidationError
from bertserve.export.graph import PRECISIONS, VARIANTS
from bertserve.export.weights import BertWeights
from bertserve.model_dir import DEFAULT_MAX_LEN, TokenizerSettings


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertserve export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", help="trained model: Google BERT checkpoint dir/prefix, HF dir, or training dir")
    parser.add_argument("out_base", help="model base path (TF Serving's --model_base_path parent)")
    parser.add_argument("--model", required=True, help="model name: the folder under OUT_BASE")
    parser.add_argument("--version", required=True, type=int, help="positive integer version folder")
    parser.add_argument("--variant", choices=VARIANTS, default="fused",
                        help="fused: bertserve custom ops (padding-free); stock: standard TF ops only")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="bf16 (fused only, served on CPU): fp32 weights, bf16 operands in the weight GEMMs")
    parser.add_argument("--onnx", action="store_true", help="also write the stock fp32 graph as ONNX")
    parser.add_argument("--validate", action="store_true",
                        help="compare the exported files with the float64 reference; fail beyond tolerance")
    parser.add_argument("--max_seq_length", type=int, default=DEFAULT_MAX_LEN,
                        help="padded length clients send; used for warmup requests and the tokenizer settings")
    parser.add_argument("--vocab", help="vocab.txt (default: the one next to SRC)")
    parser.add_argument("--do_lower_case", type=_bool,
                        help="tokenizer lower-casing, true|false (default: SRC's tokenizer_config.json, else true)")
    parser.add_argument("--init_classifier_seed", type=int,
                        help="SRC is an HF BertModel without a classifier: add a seeded, calibrated random one")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version folder")
    parser.add_argument("--warmup_batching_parameters", metavar="FILE",
                        help="the TF Serving batching file the model will be served with: the warmup file then "
                             "holds one request per (allowed batch size, token bucket), so that the GPU op captures "
                             "every CUDA graph at load time and none under load")
    parser.add_argument("--warmup_lengths", metavar="LO,HI",
                        help="real lengths (tokens) of the pairs clients send, for --warmup_batching_parameters "
                             "(default: 1,MAX_SEQ_LENGTH)")
    return parser


def warmup_plan(args: argparse.Namespace) -> "BucketWarmup | None":
    """The bucket warmup the flags ask for; a file without allowed_batch_sizes cannot be covered."""
    from bertserve.export.saved import BucketWarmup
    from bertserve.server.config_files import ConfigError, read_batching_options

    if args.warmup_batching_parameters is None:
        if args.warmup_lengths is not None:
            raise ValueError("--warmup_lengths needs --warmup_batching_parameters")
        return None
    try:
        sizes = read_batching_options(args.warmup_batching_parameters).allowed_batch_sizes
    except (ConfigError, OSError) as exc:
        raise ValueError(f"--warmup_batching_parameters {args.warmup_batching_parameters}: {exc}") from exc
    if not sizes:
        raise ValueError(f"{args.warmup_batching_parameters} sets no allowed_batch_sizes: batches of any size can "
                         f"run, so no warmup file covers them")
    lo, hi = 1, args.max_seq_length
    if args.warmup_lengths is not None:
        try:
            lo, hi = (int(part) for part in args.warmup_lengths.split(","))
        except ValueError as exc:
            raise ValueError(f"--warmup_lengths takes LO,HI (two integers), got {args.warmup_lengths!r}") from exc
    return BucketWarmup(tuple(sizes), lo, hi)


def _source_dir(src: str) -> str:
    return src if os.path.isdir(src) else os.path.dirname(src)


def tokenizer_settings(args: argparse.Namespace) -> TokenizerSettings:
    """Vocabulary and lower-casing from the flags, else from the files next to SRC."""
    vocab = args.vocab or os.path.join(_source_dir(args.src), "vocab.txt")
    if not os.path.isfile(vocab):
        raise FileNotFoundError(f"no vocabulary: {vocab} does not exist (pass --vocab PATH)")
    lower = args.do_lower_case
    config_path = os.path.join(_source_dir(args.src), "tokenizer_config.json")
    if lower is None and os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            lower = json.load(f).get("do_lower_case")
    return TokenizerSettings(vocab_file=vocab, do_lower_case=True if lower is None else bool(lower),
                             max_seq_length=args.max_seq_length)


def load_weights(args: argparse.Namespace) -> BertWeights:
    if args.init_classifier_seed is not None:
        return loaders.load_hf_encoder_as_ranker(args.src, seed=args.init_classifier_seed)
    return loaders.load_any(args.src)


def run(args: argparse.Namespace) -> int:
    from bertserve.export import graph, onnx_export, saved, validate

    stages = ["load", "build graph", "write SavedModel"] + ["ONNX"] * args.onnx + ["validate"] * args.validate
    with tqdm(total=len(stages), unit="stage", desc="export", file=sys.stderr) as bar:
        def step(name: str) -> None:
            bar.set_postfix_str(name)

        step("load")
        warmup = warmup_plan(args)
        tokenizer = tokenizer_settings(args)
        weights = load_weights(args)
        bar.update()
        step("build graph")
        module = graph.build_ranker_module(weights, args.variant, args.precision)
        bar.update()
        step("write SavedModel")
        target = saved.write_version(module, weights.config, args.out_base, args.model, args.version, tokenizer,
                                     overwrite=args.overwrite, warmup=warmup)
        bar.update()
        onnx_file = None
        if args.onnx:
            step("ONNX")
            onnx_file = onnx_export.export_onnx(weights, onnx_export.onnx_path(args.out_base, args.model,
                                                                             args.version))
            bar.update()
        rows = []
        if args.validate:
            step("validate")
            rows = validate.validate_export(weights, target, args.variant, args.precision, args.max_seq_length,
                                            onnx_file)
            bar.update()
    c = weights.config
    print(f"model: {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads, "
          f"{c.num_labels} label(s), vocab {c.vocab_size}; variant {args.variant} {args.precision}")
    print(f"wrote {target} ({saved.directory_size(target) / 2**20:.1f} MiB)")
    if onnx_file:
        print(f"wrote {onnx_file} ({os.path.getsize(onnx_file) / 2**20:.1f} MiB)")
    if rows:
        print(validate.format_table(rows))
    return 0


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        return run(args)
    except ValidationError as e:
        print(f"bertserve export: validation FAILED: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"bertserve export: error: {e}", file=sys.stderr)
        return 2
