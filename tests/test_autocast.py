"""A float32 layer under ``torch.autocast``: half-precision inputs are cast to float32 (as autocast does for
the ops it runs in float32), the kernels and the folds around them compute in float32, gradients flow back
to the bfloat16 producer; a layer converted to bfloat16 or float16 takes and returns its dtype (the kernels
compute from float32 copies); a dtype the backend cannot run is refused when the layer is made."""

from __future__ import annotations

import pytest
import torch

from rgtune.data.synthetic import random_graph
from rgtune.runtime.module import Layer

GRAPH = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)


@pytest.mark.parametrize("model, config", [("rgcn", None), ("hgt", {"reorder.compose": "on"})], ids=["rgcn", "hgt-folds"])
def test_a_layer_under_autocast_takes_bfloat16_and_computes_in_float32(model: str, config: dict | None) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 8)
    layer = Layer(model, GRAPH, 8, 8, backend="cpu", mode="training", config=config)
    x = torch.randn(30, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x)
        assert h.dtype == torch.bfloat16  # what autocast's linear returns
        out = layer(h)
        by_type = layer({t: v for t, v in zip(GRAPH.ntypes, h.split([GRAPH.num_nodes(t) for t in GRAPH.ntypes]))})
    assert out.dtype == torch.float32 and all(v.dtype == torch.float32 for v in by_type.values())
    out.square().sum().backward()
    got = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32  # through the cast, to bf16's producer
    layer.zero_grad(set_to_none=True)
    want = layer(h.detach().float())  # the same rounded input, no autocast
    torch.testing.assert_close(out.detach(), want.detach())
    want.square().sum().backward()
    for name, g in got.items():
        torch.testing.assert_close(g, layer.get_parameter(name).grad, msg=lambda m: f"{name}: {m}")


def test_outside_autocast_a_half_input_to_a_float32_layer_is_an_error_and_float64_is_refused_when_made() -> None:
    layer = Layer("rgcn", GRAPH, 8, 8, backend="cpu")
    with pytest.raises(ValueError, match="has dtype torch.bfloat16"):
        layer(torch.randn(30, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="dtype=torch.float64 is not one the cpu backend runs"):
        Layer("rgcn", GRAPH, 8, 8, backend="cpu", dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("made", ["converted", "constructed"])
def test_a_half_precision_layer_takes_and_returns_its_dtype_with_gradients_in_it(dtype: torch.dtype, made: str) -> None:
    """``layer.to(torch.bfloat16)`` (or ``Layer(dtype=...)``): input, output and gradients in that dtype; the kernels
    compute from float32 copies, so the numbers are the float32 layer's on the rounded weights and input, rounded."""
    torch.manual_seed(0)
    ref = Layer("hgt", GRAPH, 8, 8, heads=2, backend="cpu", mode="training")
    if made == "converted":
        layer = Layer("hgt", GRAPH, 8, 8, heads=2, backend="cpu", mode="training").to(dtype)
    else:
        layer = Layer("hgt", GRAPH, 8, 8, heads=2, backend="cpu", mode="training", dtype=dtype)
    layer.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
    ref.load_state_dict({k: v.to(dtype).float() for k, v in ref.state_dict().items()})  # the same rounded weights
    x = torch.randn(30, 8).to(dtype).requires_grad_(True)
    out = layer(x)
    assert out.dtype == dtype
    out.float().square().sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert all(p.grad is not None and p.grad.dtype == dtype for p in layer.parameters() if p.grad is not None)
    x32 = x.detach().float().requires_grad_(True)
    want = ref(x32)
    torch.testing.assert_close(out.float(), want.detach().to(dtype).float())
    want.square().sum().backward()
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(x.grad.float(), x32.grad, rtol=tol, atol=tol * float(x32.grad.abs().max()))
