"""Tests of the on-disk cache of a graph's derived structures and of their vectorized builders.

A structure read from the cache must equal the one built fresh, field by field and dtype by dtype,
and so must everything :func:`rgtune.ir.bind.graph_arrays` makes of them; a changed graph, format
version, damaged file or unwritable cache must never serve a wrong structure.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rgtune.data.graph as graph_mod
from rgtune.data import _cache
from rgtune.data.graph import HeteroGraph, _lexsort
from rgtune.data.synthetic import load_synthetic, random_graph
from rgtune.ir.bind import graph_arrays
from rgtune.ir.passes.layout import LAYOUTS

SPEC = "custom,nodes=400,edges=5000,ntypes=3,rels=5,multi=1,seed=11"


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder, and every graph big enough to use it."""
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(graph_mod, "DISK_CACHE_MIN_EDGES", 0)
    return tmp_path


def _structures(g: HeteroGraph) -> dict[str, Any]:
    """Every derived structure and every graph_arrays of ``g`` as plain fields."""
    out: dict[str, Any] = {}
    for side in ("dst", "src"):
        out[f"layout-{side}"] = dict(g.layout(side).__dict__)
        out[f"pairs-{side}"] = dict(g.unique_pairs(side).__dict__)
    out["csr"] = dict(g.csr_by_dst.__dict__)
    out["stats"] = g.stats.as_dict()
    for layout in LAYOUTS:
        for bits in (32, 64):
            a = graph_arrays(g, layout, bits)
            out[f"arrays-{layout}-{bits}"] = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}
    return out


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_cached_structures_equal_fresh_ones(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_synthetic(SPEC)
    built = _structures(first)
    names = sorted(p.name for p in (cache_dir / "derived").iterdir())
    assert names == sorted(f"{first.content_hash}-{s}-v1.pt" for s in
                           ("layout-dst", "layout-src", "csr-dst", "pairs-src", "pairs-dst"))

    # The second process's view: a new graph object, and no sort or unique may run (all is read).
    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached structure was rebuilt")

    monkeypatch.setattr(graph_mod, "_lexsort", no_build)
    monkeypatch.setattr(torch, "unique", no_build)
    _assert_same(built, _structures(load_synthetic(SPEC)))


def test_fresh_structures_match_a_lexsort_oracle(cache_dir: Path) -> None:
    """The builders' values are the ones np.lexsort gave (the kernels and stored results depend on them)."""
    g = random_graph((40, 30, 3), num_relations=6, num_edges=4000, multi=True, empty_relations=1, isolated_nodes=4,
                     degree_skew=1.2, seed=5)
    src, dst, et = g.src.numpy(), g.dst.numpy(), g.etype.numpy()
    assert np.array_equal(g.layout("dst").eid.numpy(), np.lexsort((src, dst, et)))
    assert np.array_equal(g.layout("src").eid.numpy(), np.lexsort((dst, src, et)))
    assert np.array_equal(g.csr_by_dst.eid.numpy(), np.lexsort((src, et, dst)))
    lay = g.layout("src")
    assert torch.equal(lay.src, g.src[lay.eid]) and torch.equal(lay.etype, g.etype[lay.eid])


@pytest.mark.parametrize("bound", [3, 1000, 2**40])
def test_lexsort_matches_numpy(bound: int) -> None:
    """Fused into one key or sorted pass by pass (2**40: three keys overflow int64), ties in index order."""
    rng = np.random.default_rng(bound)
    keys = [rng.integers(0, min(bound, 5), 3000) * (bound // min(bound, 5)) for _ in range(3)]
    got = _lexsort([(torch.from_numpy(k), bound) for k in keys])
    assert np.array_equal(got.numpy(), np.lexsort(keys[::-1]))


def test_changed_graph_or_format_reads_no_stale_file(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = load_synthetic(SPEC)
    a.layout("dst")
    b = load_synthetic(SPEC.replace("seed=11", "seed=12"))  # same sizes, other edges
    assert b.content_hash != a.content_hash
    fresh_b = np.lexsort((b.src.numpy(), b.dst.numpy(), b.etype.numpy()))
    assert np.array_equal(b.layout("dst").eid.numpy(), fresh_b)

    monkeypatch.setitem(graph_mod._DERIVED_VERSIONS, "layout", 2)
    load_synthetic(SPEC).layout("dst")
    assert (cache_dir / "derived" / f"{a.content_hash}-layout-dst-v2.pt").is_file()


def test_damaged_or_foreign_file_is_rebuilt(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    g = load_synthetic(SPEC)
    want = g.layout("dst").eid.clone()
    path = _cache.derived_path(g.content_hash, "layout-dst", 1)
    path.write_bytes(path.read_bytes()[:100])  # a torn file
    with caplog.at_level(logging.WARNING, logger="rgtune.data"):
        assert torch.equal(load_synthetic(SPEC).layout("dst").eid, want)
    assert "unreadable derived structure" in caplog.text
    caplog.clear()

    # A readable file whose arrays do not fit this graph (as if another graph's had its name).
    short = {"src": torch.zeros(3, dtype=torch.int64), "dst": torch.zeros(3, dtype=torch.int64),
             "etype": torch.zeros(3, dtype=torch.int64), "eid": torch.zeros(3, dtype=torch.int64)}
    _cache.save_derived(g.content_hash, "layout-dst", 1, short)
    with caplog.at_level(logging.WARNING, logger="rgtune.data"):
        assert torch.equal(load_synthetic(SPEC).layout("dst").eid, want)
    assert "do not fit" in caplog.text
    # ... and the rebuilt structure replaced it.
    assert torch.equal(_cache.load_derived(g.content_hash, "layout-dst", 1)["eid"], want)  # type: ignore[index]


def test_unwritable_cache_only_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(blocker))
    monkeypatch.setattr(graph_mod, "DISK_CACHE_MIN_EDGES", 0)
    g = load_synthetic(SPEC)
    with caplog.at_level(logging.WARNING, logger="rgtune.data"):
        eid = g.layout("src").eid
    assert np.array_equal(eid.numpy(), np.lexsort((g.dst.numpy(), g.src.numpy(), g.etype.numpy())))
    assert "could not write the layout-src structure" in caplog.text


def test_small_graphs_stay_off_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RGTUNE_CACHE_DIR", str(tmp_path))
    g = load_synthetic(SPEC)
    assert g.num_edges() < graph_mod.DISK_CACHE_MIN_EDGES
    g.layout("dst"), g.csr_by_dst, g.unique_pairs("src")
    assert not (tmp_path / "derived").exists()


def test_derived_path_rejects_a_bad_name() -> None:
    with pytest.raises(ValueError, match=r"structure must be .* got '\.\./x'"):
        _cache.derived_path("0123456789abcdef", "../x", 1)
