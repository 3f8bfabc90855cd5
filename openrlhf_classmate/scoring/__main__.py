"""``python -m openrlhf_classmate.scoring --list``: every data_source name the scorer registry accepts (one line per
scorer: its canonical name, then its aliases), and the suffix rules tried after the exact names. A label's
``data_source`` must be one of them, exactly (case-sensitive); the unknown-name error points here."""

from __future__ import annotations

import argparse
import sys

from openrlhf_classmate.scoring.registry import LIST_COMMAND, known_data_sources, known_suffixes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=LIST_COMMAND.removesuffix(" --list"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the registered data_source names (the default)")
    parser.parse_args(argv)
    names: dict[str, list[str]] = {}
    for name, canonical in known_data_sources().items():
        names.setdefault(canonical, [])
        if name != canonical:
            names[canonical].append(name)
    width = max(map(len, names), default=0)
    for canonical in sorted(names):
        aliases = ", ".join(sorted(names[canonical]))
        print(f"{canonical:<{width}}  {aliases}".rstrip())
    for suffix, canonical in sorted(known_suffixes().items()):
        print(f"{canonical:<{width}}  any name ending in {suffix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
