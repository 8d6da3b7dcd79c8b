"""No silent wrong numbers from the runtimes: dtypes and threads.

* dtypes: the generated kernels write float32, so every buffer the runtimes allocate is float32
  whatever ``torch.set_default_dtype`` says (cpu runtime, the CUDA host code through the
  emulator, a tuned layer's forward and backward); any other dtype of an input or a param is
  an error that names the tensor, never garbage;
* threads: one tuned layer (one built program) called from several threads gives, for every
  call, what the same call gives alone (the runtimes run one call at a time; the torch
  lowering behind the backward keeps its buffers per call).
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import pytest
import torch

import rgtune
from rgtune.codegen.base import available_backends
from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.data import HeteroGraph
from rgtune.data.synthetic import random_graph
from rgtune.torch_layers import HGT, RGAT, RGCN, RelationalLayer
from rgtune.runtime import Layer, TunedScheduleWarning, load_tuned

CPU = available_backends().get("cpu", (False, ""))[0]
needs_cpu = pytest.mark.skipif(not CPU, reason="the cpu backend cannot run here (no C compiler with OpenMP)")


@pytest.fixture(scope="module")
def small() -> HeteroGraph:
    return random_graph((30, 40), num_relations=3, num_edges=400, seed=0)


@pytest.fixture(scope="module")
def tiny() -> HeteroGraph:
    """Small enough for the emulator (every CUDA thread a green thread on one CPU thread)."""
    return random_graph((6, 9), num_relations=2, num_edges=30, seed=0)


@pytest.fixture(scope="module")
def cuda_rgat(tiny: HeteroGraph) -> tuple[Any, list[Any]]:
    """The default CUDA schedule of RGAT on ``tiny``: its kernel program and generated units
    (the emulator's tests skip where no C++ compiler can build them for the CPU)."""
    from rgtune.codegen.cuda.emulate import find_cxx
    from rgtune.codegen.cuda.generate import generate
    from rgtune.ir.models import build_model
    from rgtune.search_spaces import SearchSpace

    if find_cxx() is None:
        pytest.skip("no C++ compiler to emulate the CUDA kernels")
    space = SearchSpace(build_model("rgat", 8, 8, 2), tiny, "cuda")
    point = space.compile(space.default())
    return point.kernels, list(generate(point.kernels, point.config).units)


@pytest.fixture
def float64_default() -> Iterator[None]:
    """torch's default dtype is float64 inside the test (as in much scientific code)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _layer(model: str, g: HeteroGraph, backend: str, size: int = 8, **kw: Any) -> Layer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)  # no database: the default schedule
        return load_tuned(model, g, size, size, 1 if model == "rgcn" else 2, db=None, backend=backend, **kw)


def _oracle(model: str, g: HeteroGraph, size: int, layer: Layer) -> RelationalLayer:
    """The reference layer of ``model`` in float64, with ``layer``'s parameters."""
    cls = {"rgcn": RGCN, "rgat": RGAT, "hgt": HGT}[model]
    ref = (cls(g, size, size) if model == "rgcn" else cls(g, size, size, heads=2)).double()
    ref.load_state_dict({k: v.detach().double().cpu() for k, v in layer.state_dict().items()})
    return ref


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _inputs(kp: Any, g: HeteroGraph, width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = torch.randn(g.num_nodes(), width, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    return x, init_params(kp, g, dtype=torch.float32, seed=0)


def _reference(kp: Any, g: HeteroGraph, x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    return ReferenceExecutor(kp, g).run(x.double(), {k: v.double() for k, v in params.items()})


# ---------------------------------------------------------------------- dtypes
@needs_cpu
@pytest.mark.parametrize("schedule", [{}, {"gemm.impl": "blas"}, {"fusion.softmax": "full"},
                                      {"traversal.mapping": "edge_parallel", "compact.src": "pair"}])
def test_cpu_program_writes_float32_under_a_float64_default_dtype(small, float64_default, schedule):
    layer = rgtune.compile("rgat", small, schedule, backend="cpu", in_dim=8, out_dim=8, heads=2)
    x, params = _inputs(layer.kernels, small, 8)
    out = layer(x, params)
    err = _rel_err(out, _reference(layer.kernels, small, x, params))
    assert err < 1e-5, f"{schedule}: relative error {err:.3g} under a float64 default dtype"
    assert out.dtype == torch.float32
    with pytest.raises(TypeError, match=r"input x has dtype torch.float64; the cpu backend computes in torch.float32"):
        layer(x.double(), params)
    with pytest.raises(TypeError, match=r"param 'weight' has dtype torch.float64"):
        layer(x, {**params, "weight": params["weight"].double()})


@needs_cpu
@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_cpu_layer_forward_and_backward_under_a_float64_default_dtype(small, float64_default, model):
    layer = _layer(model, small, "cpu").float()  # .float(): what the float64 error used to advise
    ref = _oracle(model, small, 8, layer)
    x = torch.randn(small.num_nodes(), 8, generator=torch.Generator().manual_seed(2))
    x32, x64 = x.float().requires_grad_(True), x.clone().requires_grad_(True)
    out, want = layer(x32), ref(x64)
    err = _rel_err(out, want)
    assert err < 1e-5, f"{model}: forward relative error {err:.3g} under a float64 default dtype"
    assert out.dtype == torch.float32
    out.square().sum().backward()
    want.square().sum().backward()
    assert _rel_err(x32.grad, x64.grad) < 1e-4
    ref_params = dict(ref.named_parameters())
    for name, p32 in layer.named_parameters():
        assert p32.grad is not None and p32.grad.dtype == torch.float32, name
        assert _rel_err(p32.grad, ref_params[name].grad) < 1e-4, name


@needs_cpu
def test_layer_dtypes_follow_the_backend_and_errors_name_the_tensor(small, float64_default):
    layer = _layer("rgat", small, "cpu")
    assert {p.dtype for p in layer.parameters()} == {torch.float32}  # what its kernels read
    assert {p.dtype for p in _layer("rgat", small, "reference").parameters()} == {torch.float64}
    x = torch.randn(small.num_nodes(), 8)  # float64, the default
    with pytest.raises(ValueError, match=r"input has dtype torch.float64, expected torch.float32 .*"
                                         r"convert the input with \.to\(torch\.float32\)"):
        layer(x)
    with pytest.raises(ValueError, match=r"input for node type 'n0' has dtype torch.float64"):
        layer(small.split_nodes(x))
    with pytest.raises(TypeError, match=r"cannot convert to torch.float64: the cpu backend computes in "
                                        r"torch.float32 .*float64 runs on backend='reference'"):
        layer.double()  # refused where it is asked, the layer left as it was
    assert {p.dtype for p in layer.parameters()} == {torch.float32}
    layer.weight.data = layer.weight.data.double()  # behind the conversion's back: the first call says so
    with pytest.raises(TypeError, match=r"parameter 'weight' is torch.float64, but the cpu backend computes in "
                                        r"torch.float32; convert the layer with \.float\(\)"):
        layer(x.float())
    layer.weight.data = layer.weight.data.float()
    layer.attn_src.data = layer.attn_src.data.half()
    with pytest.raises(TypeError, match=r"parameter 'attn_src' is torch.float16"):
        layer(x.float())


def test_reference_layer_gradcheck_under_a_float64_default_dtype(float64_default):
    tiny = random_graph((4, 5), num_relations=3, num_edges=16, seed=3)
    layer = _layer("rgat", tiny, "reference", size=4)
    names = [n for n, _ in layer.named_parameters()]
    x = torch.randn(tiny.num_nodes(), 4, requires_grad=True)
    params = tuple(p.detach().clone().requires_grad_(True) for p in layer.parameters())
    assert x.dtype == torch.float64 and all(p.dtype == torch.float64 for p in params)

    def f(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


def test_emulated_cuda_host_path_writes_float32_under_a_float64_default_dtype(tiny, cuda_rgat, float64_default):
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    kp, units = cuda_rgat
    x, params = _inputs(kp, tiny, 8)
    out = EmulatedProgram(kp, units, tiny).run(x, params)
    err = _rel_err(out, _reference(kp, tiny, x, params))
    assert err < 1e-5, f"relative error {err:.3g} under a float64 default dtype"
    assert out.dtype == torch.float32


# ---------------------------------------------------------------------- threads
def _in_threads(fn: Callable[[Any], Any], items: Sequence[Any], threads: int) -> list[Any]:
    """``fn`` of every item, ``threads`` threads taking turns over the items, started together."""
    out: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(first: int) -> None:
        start.wait()
        try:
            for i in range(first, len(items), threads):
                out[i] = fn(items[i])
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return out


@needs_cpu
def test_one_cpu_layer_called_from_threads_gives_the_single_threaded_outputs():
    # big enough that the kernels of one call run while another thread starts the next (ctypes
    # releases the GIL); 4 threads x 20 calls
    g = random_graph((300, 300), num_relations=3, num_edges=3000, seed=0)
    layer = _layer("rgat", g, "cpu", size=16)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(g.num_nodes(), 16, generator=gen) for _ in range(80)]
    with torch.no_grad():
        alone = [layer(x) for x in xs]
        together = _in_threads(lambda x: layer(x), xs, threads=4)
    wrong = [i for i, (a, b) in enumerate(zip(together, alone)) if not torch.equal(a, b)]
    assert not wrong, f"{len(wrong)} of {len(xs)} outputs from 4 threads differ from the same calls made alone"


@needs_cpu
def test_backward_of_one_layer_from_threads_gives_the_single_threaded_gradients():
    g = random_graph((100, 100), num_relations=3, num_edges=1000, seed=1)
    layer = _layer("rgat", g, "cpu", size=8)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(g.num_nodes(), 8, generator=gen) for _ in range(12)]

    def grad_of_input(x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(layer(x).square().sum(), x)
        return grad

    alone = [grad_of_input(x) for x in xs]
    together = _in_threads(grad_of_input, xs, threads=3)
    wrong = [i for i, (a, b) in enumerate(zip(together, alone)) if not torch.equal(a, b)]
    assert not wrong, f"{len(wrong)} of {len(xs)} input gradients from 3 threads differ from the same calls made alone"


def test_emulated_cuda_program_runs_one_call_at_a_time(tiny, cuda_rgat):
    """The host code a GPU program shares with the emulator (ProgramRunner.run) lets one call's
    launches finish before another call's start: on a GPU, calls share the recorded graph's
    buffers and the kernel parameter arrays."""
    from rgtune.codegen.cuda.emulate import EmulatedProgram

    class Recording(EmulatedProgram):
        """Records the thread of every launch; launches one at a time (the emulated kernels keep
        global state) and pauses after each, so that another thread could launch in between."""

        def _launch(self, step: Any, args: list[int]) -> None:
            with guard:
                launches.append(threading.get_ident())
                super()._launch(step, args)
            time.sleep(0.002)

    guard, launches = threading.Lock(), []
    kp, units = cuda_rgat
    program = Recording(kp, units, tiny)
    x, params = _inputs(kp, tiny, 8)
    xs = [x * (i + 1) for i in range(8)]
    alone = [program.run(v, params) for v in xs]
    per_call = len(launches) // len(xs)
    launches.clear()
    together = _in_threads(lambda v: program.run(v, params), xs, threads=2)
    calls = [launches[i:i + per_call] for i in range(0, len(launches), per_call)]
    mixed = [c for c in calls if len(set(c)) > 1]
    assert not mixed, f"launches of two calls interleaved in {len(mixed)} of {len(calls)} calls"
    assert all(torch.equal(a, b) for a, b in zip(together, alone))


# ---------------------------------------------------------------------- the same on a GPU
def _gpu() -> tuple[bool, str]:
    from rgtune.codegen.cuda.backend import CudaBackend

    return CudaBackend.available()


@pytest.mark.gpu
def test_cuda_layer_from_threads_and_under_a_float64_default_dtype(float64_default):
    ok, why = _gpu()
    if not ok:
        pytest.skip(f"needs a CUDA GPU with CuPy: {why}")
    g = random_graph((300, 300), num_relations=3, num_edges=3000, seed=0)
    layer = _layer("rgat", g, "cuda", size=16)  # replays a recorded CUDA graph
    assert {p.dtype for p in layer.parameters()} == {torch.float32}
    ref = _oracle("rgat", g, 16, layer)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(g.num_nodes(), 16, generator=gen, dtype=torch.float32) for _ in range(24)]
    with torch.no_grad():
        assert _rel_err(layer(xs[0].cuda()).cpu(), ref(xs[0].double())) < 1e-4
        alone = [layer(x.cuda()).cpu() for x in xs]

        def on_own_stream(x: torch.Tensor) -> torch.Tensor:
            with torch.cuda.stream(torch.cuda.Stream()):  # each call queued on a stream of its own
                return layer(x.cuda()).cpu()

        together = _in_threads(on_own_stream, xs, threads=3)
    wrong = [i for i, (a, b) in enumerate(zip(together, alone)) if not torch.equal(a, b)]
    assert not wrong, f"{len(wrong)} of {len(xs)} outputs from 3 threads differ from the same calls made alone"
