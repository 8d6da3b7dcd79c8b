"""``rgtune.nn.dgl``: DGL's ``RelGraphConv`` by an import line. Its state dict loads both ways and gives DGL's
outputs and gradients (DGL is the oracle, installed in CI), with ``norm=None`` (a sum) and with DGL's right
normalization per relation (a mean); any other ``norm`` and what rgtune does not compute are errors."""

from __future__ import annotations

import warnings

import pytest
import torch

from rgtune.nn.dgl import RelGraphConv
from rgtune.runtime._lookup import TunedScheduleWarning

from _dropin import assert_same_as_library

N, E, R = 50, 300, 4


def _graph(seed: int = 0):
    import dgl

    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, N, (E,), generator=gen), torch.randint(0, N, (E,), generator=gen)
    etypes = torch.randint(0, R, (E,), generator=gen)
    norm_key = etypes * N + dst
    norm = (1.0 / torch.bincount(norm_key, minlength=R * N)[norm_key].float()).unsqueeze(1)
    return dgl.graph((src, dst), num_nodes=N), torch.randn(N, 8, generator=gen), etypes, norm


def _quiet(conv, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        return conv(*args, **kw)


@pytest.mark.parametrize("regularizer, bases", [(None, None), ("basis", 2), ("bdd", 4)])
@pytest.mark.parametrize("normalized", [False, True], ids=["sum", "mean"])
def test_relgraphconv_equals_dgl_both_ways(regularizer, bases, normalized):
    from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv

    g, x, etypes, norm = _graph()
    norm = norm if normalized else None
    torch.manual_seed(0)
    theirs = DGLRelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu)
    ours = RelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu, db=None)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        theirs.h_bias.uniform_(-0.5, 0.5)  # DGL starts it at zero: other values check the mapping
    ours.load_state_dict(theirs.state_dict())
    assert_same_as_library(theirs, ours, lambda v: theirs(g, v, etypes, norm), lambda v: _quiet(ours, g, v, etypes, norm),
                           x)
    back = DGLRelGraphConv(8, 8, R, regularizer, bases, activation=torch.relu)
    back.load_state_dict(ours.state_dict())  # rgtune -> DGL
    assert torch.allclose(back(g, x, etypes, norm), _quiet(ours, g, x, etypes, norm), rtol=1e-4, atol=1e-5)


def test_another_norm_and_what_rgtune_does_not_compute_are_refused():
    g, x, etypes, norm = _graph()
    conv = RelGraphConv(8, 8, R, db=None)
    with pytest.raises(ValueError, match="norm must be None"):
        _quiet(conv, g, x, etypes, norm * 2)
    for kwargs, says in (({"layer_norm": True}, "layer_norm=True"), ({"self_loop": False}, "self_loop=False"),
                         ({"bias": False}, "bias=False")):
        with pytest.raises(ValueError, match=says):
            RelGraphConv(8, 8, R, db=None, **kwargs)


@pytest.mark.slow
def test_dgls_aifb_script_trains_the_same_with_rgtunes_import(tmp_path):
    """docs/examples/dgl_rgcn_aifb.py, DGL's entity classification (basis regularizer, right normalization per
    relation) with the import line as the only change: the same losses from the same initial weights."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "dgl_rgcn_aifb.py"
    losses = {}
    for impl in ("dgl", "rgtune"):
        out = tmp_path / f"{impl}.json"
        subprocess.run([sys.executable, str(path), "--impl", impl, "--epochs", "4", "--init", str(tmp_path / "init.pt"),
                        "--json", str(out)], check=True, capture_output=True, cwd=tmp_path, timeout=600)
        losses[impl] = json.loads(out.read_text())["losses"]
    assert len(losses["dgl"]) == 4
    for a, b in zip(losses["dgl"], losses["rgtune"]):
        assert abs(a - b) <= 1e-4 * abs(a), losses
