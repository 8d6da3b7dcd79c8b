"""The front door that every model and drop-in shares (:mod:`rgtune.runtime.module`, :mod:`rgtune.nn`).

* Empty graphs: a graph with no nodes, one with nodes but no edges, one whose relation has no edges and
  one whose node type has no nodes run every model (rgcn, rgat, hgt, film) forward and backward, on the
  whole graph and on a mini-batch block, on the ``cpu`` backend against the float64 reference layer with
  the same parameters, and on the CUDA emulator (a training step: forward phase, backward phase) against
  the float64 reference executor; the drop-ins give ``(0, out)`` for no nodes, as PyG does.
* Dtypes: ``.double()`` / ``.to(torch.float64)`` on a ``Layer`` or a drop-in of the cpu backend is refused where it
  is asked (a ``TypeError`` naming what runs: float32, 16-bit through float32 copies, float64 on the reference),
  the module left as it was; what the message says runs does; an input of another dtype names the tensor.
* ``Layer`` runs on the best backend by default (``cpu`` here, not the plain torch executor) and takes a PyG
  ``HeteroData`` or a DGL graph.
* The missing-schedule warning comes once for a model's kind of workload (two layers, two models) and names
  ``rgtune.tune(model, *inputs, ...)``; that call on a two-layer PyG-style model with 2 trials on the cpu backend
  records both workloads (counted in the database), and the next call finds them (no warning, provenance
  ``database``, the same numbers); ``rgtune.tune("rgcn", graph, ...)`` still takes a graph.
* Too few rows say so in the caller's words (``x has 5 rows but the graph has 7 nodes``; per type; a block's).
"""

from __future__ import annotations


import pytest
import torch

from rgtune.data import HeteroGraph
from rgtune.data.batch import Batch
from rgtune.nn import Layer

MODELS = {"rgcn": 1, "rgat": 2, "hgt": 2, "film": 1}
RELS = [("a", "r0", "b"), ("b", "r1", "a"), ("a", "r2", "a")]


def _none() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)


def _edges(src: list[int], dst: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)


def empty_case(kind: str) -> HeteroGraph:
    """A small graph with one kind of emptiness."""
    if kind == "no nodes":
        return HeteroGraph({"a": 0, "b": 0}, {c: _none() for c in RELS}, name="no-nodes")
    if kind == "no edges":
        return HeteroGraph({"a": 3, "b": 4}, {c: _none() for c in RELS}, name="no-edges")
    if kind == "empty relation":
        return HeteroGraph({"a": 3, "b": 4}, {RELS[0]: _edges([0, 1, 2, 2], [1, 2, 3, 0]), RELS[1]: _none(),
                                               RELS[2]: _edges([0, 2, 1], [1, 1, 0])}, name="empty-relation")
    if kind == "empty node type":
        return HeteroGraph({"a": 3, "b": 0}, {RELS[0]: _none(), RELS[1]: _none(),
                                               RELS[2]: _edges([0, 2, 1], [1, 1, 2])}, name="empty-ntype")
    raise AssertionError(kind)


CASES = ["no nodes", "no edges", "empty relation", "empty node type"]


def _block(g: HeteroGraph) -> Batch:
    """A block of ``g``: every node a source, the first half of each type a destination, the edges into those."""
    num_dst = {t: g.num_nodes(t) // 2 + (g.num_nodes(t) % 2) for t in g.ntypes}
    edges = {}
    for c in g.canonical_etypes:
        s, d = g.edges(c)
        keep = d < num_dst[c[2]]
        edges[c] = (s[keep], d[keep])
    return Batch(g.ntypes, g.canonical_etypes, num_src={t: g.num_nodes(t) for t in g.ntypes}, num_dst=num_dst,
                 edges=edges)


def _close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    scale = ref.abs().max().item() if ref.numel() else 0.0
    err = (got.double() - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= 1e-4 * max(scale, 1.0), f"{what}: max error {err:.2e} (reference max {scale:.2e})"


def _against_reference(model: str, g: HeteroGraph, on: "HeteroGraph | Batch | None", rows: int) -> None:
    """The cpu layer's output, input gradient and parameter gradients against the float64 reference layer."""
    heads = MODELS[model]
    layer = Layer(model, g, 4, 8, heads=heads, backend="cpu")
    ref = Layer(model, g, 4, 8, heads=heads, backend="reference", dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(0))
    xs, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    out, expect = layer(xs, graph=on), ref(xr, graph=on)
    _close(out, expect, f"{model} output")
    dout = torch.randn(expect.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(dout.float())
    expect.backward(dout)
    _close(xs.grad, xr.grad, f"{model} input gradient")
    mine = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        if mine[name].grad is None:  # a parameter the model does not use at these sizes (hgt's skip, in != out)
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        _close(p.grad, mine[name].grad, f"{model} gradient of {name}")


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("model", list(MODELS))
def test_empty_graphs_run_on_the_cpu_backend(model: str, kind: str) -> None:
    g = empty_case(kind)
    _against_reference(model, g, None, g.num_nodes())


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("model", list(MODELS))
def test_empty_blocks_run_on_the_cpu_backend(model: str, kind: str) -> None:
    g = empty_case(kind)
    block = _block(g)
    _against_reference(model, g, block, block.num_nodes())


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("model", list(MODELS))
def test_empty_graphs_run_on_the_cuda_emulator(model: str, kind: str) -> None:
    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate
    from rgtune.codegen.reference import ReferenceExecutor, init_params
    from rgtune.ir.models import build_model
    from rgtune.search_spaces import SearchSpace

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator (set CXX)")
    g = empty_case(kind)
    space = SearchSpace(build_model(model, 4, 8, MODELS[model]), g, "cuda", mode="training")
    point = space.compile(space.default())
    assert point.valid, point.problems
    kp = point.kernels
    params = init_params(kp, g, dtype=torch.float64, seed=3)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(g.num_nodes(), 4, dtype=torch.float64, generator=gen)
    dout = torch.randn(g.num_nodes(), 8, dtype=torch.float64, generator=gen)
    ref_out, ref_dx, ref_grads = ReferenceExecutor(kp, g).run_training(x, params, dout)
    program = EmulatedProgram(kp, generate(kp, point.config).units, g)
    out, saved = program.run_forward(x, params, fill=float("nan"))
    dx, grads = program.run_backward(x, params, saved, dout, fill=float("nan"))
    _close(out, ref_out, "output")
    _close(dx, ref_dx, "input gradient")
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        _close(grads[name], ref_grads[name], f"gradient of {name}")


def test_dropins_give_no_rows_for_no_nodes() -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    from rgtune.nn.pyg import RGCNConv

    edge_index, edge_type = torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    theirs = pyg.RGCNConv(4, 8, num_relations=3)
    ours = RGCNConv(4, 8, num_relations=3)
    x = torch.randn(0, 4, requires_grad=True)
    expect = theirs(x, edge_index, edge_type)
    got = ours(x, edge_index, edge_type)
    assert got.shape == expect.shape == (0, 8)
    got.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 4)


# ---------------------------------------------------------------------- dtypes
def _small() -> HeteroGraph:
    return empty_case("empty relation")


@pytest.mark.parametrize("convert", ["double", "to64"])
def test_a_layer_refuses_a_dtype_its_backend_cannot_run_where_it_is_converted(convert: str) -> None:
    layer = Layer("rgcn", _small(), 4, 8, backend="cpu")
    with pytest.raises(TypeError, match=r"Layer: cannot convert to torch.float64: the cpu backend computes in "
                                        r"torch.float32 .*float16 or torch.bfloat16.*precision.*"
                                        r"float64 runs on backend='reference'"):
        layer.double() if convert == "double" else layer.to(torch.float64)
    assert {p.dtype for p in layer.parameters()} == {torch.float32}  # left as it was
    assert layer(torch.randn(7, 4)).dtype == torch.float32
    for half in (torch.float16, torch.bfloat16):  # what the message says runs: it does
        assert Layer("rgcn", _small(), 4, 8, backend="cpu").to(half)(torch.randn(7, 4, dtype=half)).dtype == half
    Layer("rgcn", _small(), 4, 8, backend="reference").double()  # the reference runs any float dtype


def test_a_wrong_dtype_input_names_the_tensor_and_what_works() -> None:
    layer = Layer("rgcn", _small(), 4, 8, backend="cpu")
    with pytest.raises(ValueError, match=r"input has dtype torch.float16, expected torch.float32 \(the layer's dtype\); "
                                         r"convert the input with \.to\(torch\.float32\), or the layer with "
                                         r"\.to\(torch\.float16\)"):
        layer(torch.randn(7, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"input for node type 'a' has dtype torch.float64, expected torch.float32 "
                                         r"\(the layer's dtype\); convert the input with \.to\(torch\.float32\) "
                                         r"\(the cpu backend"):
        layer({"a": torch.randn(3, 4, dtype=torch.float64), "b": torch.randn(4, 4)})


def test_a_dropin_refuses_a_dtype_where_it_is_converted_and_names_a_wrong_input() -> None:
    from rgtune.nn.pyg import RGCNConv

    conv = RGCNConv(4, 8, num_relations=3, db=None)
    for convert in (lambda m: m.double(), lambda m: m.to(torch.float64)):
        with pytest.raises(TypeError, match=r"RGCNConv: cannot convert to torch.float64: the cpu backend computes"):
            convert(conv)
    assert {p.dtype for p in conv.parameters()} == {torch.float32}
    edge_index, edge_type = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"RGCNConv: x has dtype torch.float64, but the module's parameters are "
                                         r"torch.float32; convert x with \.to\(torch\.float32\) \(the cpu backend"):
        conv(torch.randn(3, 4, dtype=torch.float64), edge_index, edge_type)
    half = RGCNConv(4, 8, num_relations=3, db=None).bfloat16()  # runs, through float32 copies
    assert half(torch.randn(3, 4, dtype=torch.bfloat16), edge_index, edge_type).dtype == torch.bfloat16
    RGCNConv(4, 8, num_relations=3, db=None, backend="reference").double()


# ---------------------------------------------------------------------- the default backend, library graphs
def test_a_layer_runs_on_the_best_backend_by_default_and_takes_library_graphs() -> None:
    from rgtune.data.interop import to_pyg

    g = _small()
    layer = Layer("hgt", g, 4, 8, heads=2)
    assert layer.backend == "cpu"  # not the plain torch executor
    ref = Layer("hgt", g, 4, 8, heads=2, backend="reference")
    assert ref.backend == "reference"
    pytest.importorskip("torch_geometric")
    from_pyg = Layer("rgcn", to_pyg(g), 4, 8)
    assert from_pyg.graph.content_hash == g.content_hash and from_pyg.backend == "cpu"
    with pytest.raises(TypeError, match="Layer: graph must be a rgtune HeteroGraph, a PyG HeteroData, a DGL graph"):
        Layer("rgcn", 42, 4, 8)


def test_a_layer_takes_a_dgl_graph() -> None:
    pytest.importorskip("dgl")
    from rgtune.data.interop import to_dgl

    g = _small()
    layer = Layer("rgcn", to_dgl(g), 4, 8)
    assert layer.graph.content_hash == g.content_hash
    assert layer(torch.randn(7, 4)).shape == (7, 8)


# ---------------------------------------------------------------------- rgtune.tune(model, *inputs)
class _TwoConvs(torch.nn.Module):
    """A PyG-style script's model: two RGCNConvs of rgtune.nn.pyg (other sizes: two workloads)."""

    def __init__(self, db: str) -> None:
        super().__init__()
        from rgtune.nn.pyg import RGCNConv

        self.conv1 = RGCNConv(4, 8, num_relations=3, db=db)
        self.conv2 = RGCNConv(8, 8, num_relations=3, db=db)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_type: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index, edge_type).relu(), edge_index, edge_type)


def _pyg_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(12, 4, generator=gen), torch.randint(0, 12, (2, 40), generator=gen),
            torch.randint(0, 3, (40,), generator=gen))


def test_the_missing_schedule_warning_comes_once_per_kind_and_names_a_call_a_script_can_make(tmp_path) -> None:
    import warnings

    from rgtune.runtime._lookup import TunedScheduleWarning

    db = str(tmp_path / "results.db")
    x, edge_index, edge_type = _pyg_inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _TwoConvs(db)
        model(x, edge_index, edge_type)
        model(x, edge_index, edge_type)
        _TwoConvs(db)(x, edge_index, edge_type)  # another model of the same kind: its layers too stay quiet
    said = [str(w.message) for w in caught if issubclass(w.category, TunedScheduleWarning)]
    assert len(said) == 1, said
    assert "rgtune.tune(model, *inputs, trials=50)" in said[0] and "this graph" not in said[0]
    assert "with this graph" not in said[0] and "'pyg'" not in said[0]


def test_tune_a_model_then_its_modules_find_their_schedules(tmp_path) -> None:
    import warnings

    import rgtune
    from rgtune.db import TrialDatabase
    from rgtune.runtime._lookup import TunedScheduleWarning

    db = str(tmp_path / "results.db")
    x, edge_index, edge_type = _pyg_inputs()
    model = _TwoConvs(db)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        before = model(x, edge_index, edge_type)  # the default schedules, looked up (nothing recorded yet)
    summaries = rgtune.tune(model, x, edge_index, edge_type, trials=2, backend="cpu", progress=False,
                            cost_model=False, confirm_top=0, seed=0)
    assert len(summaries) == 2 and all(s.measured == 2 for s in summaries)
    with TrialDatabase(db) as database:
        workloads = database.workloads()
        assert sorted((w.in_dim, w.out_dim, w.mode, w.backend) for w in workloads) == [
            (4, 8, "training", "cpu"), (8, 8, "training", "cpu")]
        assert database.count_trials() >= 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", TunedScheduleWarning)  # a record is found: no warning
        after = model(x, edge_index, edge_type)
    for conv in (model.conv1, model.conv2):
        assert conv._layer.provenance["source"] == "database"
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)  # the same parameters, another schedule


def test_tune_by_name_still_takes_a_dataset_or_graph(tmp_path) -> None:
    import rgtune

    s = rgtune.tune("rgcn", _small(), hidden=4, trials=1, db=str(tmp_path / "r.db"), backend="reference",
                    progress=False, cost_model=False, confirm_top=0, seed=0)
    assert s.measured == 1
    with pytest.raises(TypeError, match="takes one dataset or graph"):
        rgtune.tune("rgcn", _small(), _small(), trials=1)
    with pytest.raises(TypeError, match="holds no rgtune module"):
        rgtune.tune(torch.nn.Linear(2, 2), torch.randn(1, 2), trials=1)


# ---------------------------------------------------------------------- errors in the caller's words
def test_too_few_rows_are_said_in_the_callers_words() -> None:
    g = _small()  # a: 3 nodes, b: 4
    layer = Layer("rgcn", g, 4, 8, backend="reference")
    with pytest.raises(ValueError, match=r"^Layer: x has 5 rows but the graph has 7 nodes$"):
        layer(torch.randn(5, 4))
    with pytest.raises(ValueError, match=r"^Layer: x\['b'\] has 2 rows but the graph has 4 nodes of type 'b'$"):
        layer({"a": torch.randn(3, 4), "b": torch.randn(2, 4)})
    block = _block(g)
    with pytest.raises(ValueError, match=r"^Layer: x has 6 rows but the block has 7 source nodes$"):
        layer(torch.randn(6, 4), graph=block)
    with pytest.raises(ValueError, match=r"^Layer: x\['a'\] has 1 row but the block has 3 source nodes of type 'a'$"):
        layer({"a": torch.randn(1, 4), "b": torch.randn(4, 4)}, graph=block)
