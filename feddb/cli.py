"""`feddb <command> [options]`: one entry point for the project's tools; `feddb <command> --help`
describes each. The user's pipeline (this package): run (or local) -> sweep -> report, and deploy
for SuperLink and SuperNodes. The instruments live apart and load only when called: the claims
study, its reproduction and the ladder in studies/; speed and attack measurements in benchmarks/."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "run": ("feddb.launch", "one Flower simulation (`flwr run` sized from the configuration)"),
    "local": ("feddb.inprocess", "the same run in this process, without Ray's start-up"),
    "sweep": ("feddb.sweep", "a resumable grid of runs (Hydra multirun: -m row=... seed=...)"),
    "report": ("feddb.report", "tables, paired differences and figures from run directories"),
    "claims": ("studies.claims", "the paper's claims tested on the claims study's runs"),
    "reproduce": ("studies.reproduce", "re-run a table's runs, check they land within tolerance"),
    "ladder": ("studies.ladder", "the sanity ladder: centralised, federated, protocol rungs"),
    "attacks": ("benchmarks.attacks", "the attack benchmark: one malicious client of five a round"),
    "bench": ("benchmarks.speed", "the speed benchmark"),
    "overhead": ("benchmarks.overhead", "a round's time with a null trainer, and Flower's floor"),
    "startup": ("benchmarks.startup", "seconds from the SuperLink's start to the first round"),
    "threads": ("benchmarks.threads", "seconds a round by CPU threads, idle and by a busy core"),
    "throughput": ("benchmarks.throughput", "a sweep's rounds per second with N runs side by side"),
    "floor": ("benchmarks.floor", "a sweep's FLOPs, counted, and the fastest fp32 could run them"),
    "tables": ("feddb.tables", "the docs' measured tables, rendered from the measurement files"),
    "deploy": ("feddb.deploy", "SuperLink and SuperNodes: certs, keys, export, local"),
}
NO_ARGV = ("sweep", "bench")  # these read sys.argv themselves (Hydra, argparse)


def usage() -> str:
    width = max(map(len, COMMANDS))
    return (
        "usage: feddb <command> [options]    (feddb <command> --help for its options)\n\n"
        "commands:\n" + "\n".join(f"  {c:<{width}}  {h}" for c, (_, h) in COMMANDS.items())
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(
            f"error: unknown command '{cmd}'; choose from {', '.join(COMMANDS)} (feddb --help)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    sys.argv = [f"feddb {cmd}", *rest]  # argparse's usage lines name the subcommand
    if cmd in NO_ARGV:
        return int(module.main() or 0)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
