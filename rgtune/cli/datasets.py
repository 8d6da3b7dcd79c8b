"""``rgtune datasets``: the datasets and synthetic presets ``--dataset`` takes, and where data is looked for."""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list the datasets and synthetic presets",
                       description="List the datasets and synthetic presets that --dataset takes.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rgtune.data import list_datasets
    from rgtune.data.synthetic import describe_presets

    print("datasets (--dataset NAME):")
    for name, about in list_datasets().items():
        print(f"  {name:<12} {about}")
    print("\nsynthetic presets (--dataset synthetic:PRESET[,key=value...]):")
    for line in describe_presets():
        print(f"  {line}")
    root = os.environ.get("RGTUNE_DATA_DIR")
    print(f"\ndata root: {root or '(unset: set RGTUNE_DATA_DIR or pass --data-dir; else the user cache)'}")
    return 0
