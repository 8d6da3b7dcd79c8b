"""A float32 layer under ``torch.autocast``: it runs its schedule of the autocast type (intermediates stored in
16 bits, sums in float32) and returns that type, as autocast's ops in their lower type do; gradients flow back
to the bfloat16 producer, the parameters' in float32; a layer converted to bfloat16 or float16 takes and returns its dtype (the kernels
compute from float32 copies); a dtype the backend cannot run is refused when the layer is made."""

from __future__ import annotations

import pytest
import torch

from rgtune.data.synthetic import random_graph
from rgtune.runtime.module import Layer

GRAPH = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)


@pytest.mark.parametrize("model, config", [("rgcn", None), ("hgt", {"reorder.compose": "on"})], ids=["rgcn", "hgt-folds"])
def test_a_float32_layer_under_autocast_runs_its_16_bit_schedule_and_returns_bfloat16(model: str, config: dict | None
                                                                                       ) -> None:
    """Like an op autocast runs in its lower type: the layer's schedule with its intermediates in bfloat16 (the same
    numbers as a layer made with that schedule, called in float32 outside autocast), the output in bfloat16, the
    parameters' gradients in float32 and the input's back to the bfloat16 producer."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 8)
    layer = Layer(model, GRAPH, 8, 8, backend="cpu", mode="training", config=config)
    low = layer.autocast_schedule(torch.bfloat16)
    assert low is not None and {v for k, v in low["training"].items() if k.startswith("precision.")} == {"bfloat16"}
    assert {k: v for k, v in low["training"].items() if not k.startswith("precision.")} == \
        {k: v for k, v in layer.training_config.items() if not k.startswith("precision.")}
    x = torch.randn(30, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(x)
        assert h.dtype == torch.bfloat16  # what autocast's linear returns
        out = layer(h)
        by_type = layer({t: v for t, v in zip(GRAPH.ntypes, h.split([GRAPH.num_nodes(t) for t in GRAPH.ntypes]))})
    assert out.dtype == torch.bfloat16 and all(v.dtype == torch.bfloat16 for v in by_type.values())
    out.float().square().sum().backward()
    got = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    assert got and all(g.dtype == torch.float32 for g in got.values())
    assert lin.weight.grad is not None and lin.weight.grad.dtype == torch.float32  # through the cast, to bf16's producer
    twin = Layer(model, GRAPH, 8, 8, backend="cpu", mode="training", config=low["training"])
    twin.load_state_dict(layer.state_dict())
    want = twin(h.detach().float())  # the same rounded input, the 16-bit schedule, no autocast
    torch.testing.assert_close(out.detach(), want.detach().to(torch.bfloat16))
    want.float().square().sum().backward()
    for name, g in got.items():  # the output's rounding to bfloat16 is the only difference
        torch.testing.assert_close(g, twin.get_parameter(name).grad, rtol=2e-2, atol=2e-2 * float(g.abs().max()),
                                   msg=lambda m: f"{name}: {m}")
    assert layer(h.detach().float()).dtype == torch.float32  # outside autocast: the layer's own float32 schedule


def test_under_autocast_a_layer_not_in_float32_or_a_dtype_without_storage_runs_its_own_schedule() -> None:
    layer = Layer("rgcn", GRAPH, 8, 8, backend="cpu", dtype=torch.bfloat16)
    assert layer.autocast_schedule(torch.bfloat16) is None and layer.autocast_schedule(torch.float64) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.randn(30, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="autocast_config has a schedule for 'bf16'"):
        Layer("rgcn", GRAPH, 8, 8, backend="cpu", autocast_config={"bf16": {}})


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
