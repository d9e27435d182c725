"""The one console script, `bertserve <subcommand> ...`: each subcommand lives in the module that owns its job."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, function taking argv list and returning an exit code, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "export": ("bertserve.export.cli", "main", "export a trained BERT ranker as TF Serving model versions"),
    "serve": ("bertserve.server.main", "main", "run the TF-Serving-compatible model server"),
    "rank": ("bertserve.client.cli", "rank_main", "rank candidate replies for a query"),
    "loadtest": ("bertserve.loadtest.cli", "loadtest_main", "QPS / latency load test against a server"),
    "tune-batching": ("bertserve.loadtest.cli", "tune_main", "search batching parameters under a P99 SLO"),
}


def _usage() -> str:
    lines = ["usage: bertserve <subcommand> [args...]", "", "subcommands:"]
    lines += [f"  {name:<14} {helptext}" for name, (_, _, helptext) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"bertserve: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
