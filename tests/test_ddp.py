"""Data-parallel training: the documented example (``docs/examples/ddp_minibatch.py``) run with 2 processes
under DistributedDataParallel (gloo, CPU) ends with the same parameters on both ranks, and with those of
one process taking the same steps over the union of the ranks' batches."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "ddp_minibatch.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(*args: str) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "5", "--batch-size", "32", "--fanouts", "5,5",
                           *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_ranks_end_equal_and_equal_to_one_process_over_their_batches(tmp_path: Path) -> None:
    _run("--world-size", "2", "--port", str(_free_port()), "--out", str(tmp_path))
    _run("--world-size", "2", "--single", "--out", str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    single = torch.load(tmp_path / "single.pt")
    assert set(ranks[0]) == set(single) and any(k.startswith("layers.0.") for k in single)
    for name, value in single.items():
        assert torch.allclose(ranks[0][name], ranks[1][name], atol=1e-5, rtol=0), name
        assert torch.allclose(ranks[0][name], value, atol=1e-5, rtol=0), name
    # not a comparison of untouched weights: the steps moved every rgtune parameter
    _run("--world-size", "2", "--single", "--steps", "0", "--out", str(tmp_path))
    initial = torch.load(tmp_path / "single.pt")
    for name in single:
        if name.startswith("layers."):
            assert not torch.equal(single[name], initial[name]), name
