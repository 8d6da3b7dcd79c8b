"""Argument groups shared by the commands that name one layer workload (``export``, ``bench``)."""

from __future__ import annotations

import argparse

from rgtune.ir.models import MODELS as _IR_MODELS

MODELS = tuple(_IR_MODELS)  # the models the IR defines: rgcn, rgat, hgt


def positive_int(text: str) -> int:
    """An argparse type: an integer > 0, with an error that names the bad value."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def add_layer_args(p: argparse.ArgumentParser, dataset_help: str) -> None:
    """``--model --dataset --data-dir --hidden --in-dim --out-dim --heads --backend``."""
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--dataset", required=True, help=dataset_help)
    p.add_argument("--data-dir", default=None, help="dataset root (default: $RGTUNE_DATA_DIR, else the user cache)")
    p.add_argument("--hidden", type=positive_int, default=64, help="in and out feature size (default 64)")
    p.add_argument("--in-dim", type=positive_int, default=None, help="input feature size (default --hidden)")
    p.add_argument("--out-dim", type=positive_int, default=None, help="output feature size (default --hidden)")
    p.add_argument("--heads", type=positive_int, default=1, help="attention heads (RGAT, HGT; default 1)")
    p.add_argument("--backend", default="auto", help="auto (default: cuda if a GPU is usable, else cpu), cpu, cuda, "
                                                     "reference")
