"""Per-op rules (rgtune.ir.op_rules): an op is one module.

The acceptance test adds an op that exists only in this file, ``swish(x) = x * sigmoid(x)``, with its
four rules (interpret, adjoint, inline, flops), and runs a model that uses it forward and backward:
the interpreter's training program against torch's autograd, the C/OpenMP backend, and the generated
CUDA on the CPU emulator (and through NVRTC). ``concat``'s adjoint (a ``slice`` of the gradient per
operand, README's worked example) is checked the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import pytest
import torch

from rgtune.codegen.reference import ReferenceExecutor, init_params
from rgtune.data.synthetic import random_graph
from rgtune.ir.autodiff import SAVE, adjoint
from rgtune.ir.counts import program_flops
from rgtune.ir.interpret import Interpreter, random_params
from rgtune.ir.kernels import BinaryE, Expr, UnaryE
from rgtune.ir.op_rules import OpRules, register_op, rules_of, unregister_op
from rgtune.ir.pipeline import compile_program
from rgtune.ir.program import Binary, IRError, Op, Program, ProgramBuilder, Unary, Value
from rgtune.runtime import Layer
from rgtune.search_spaces import SearchSpace


# ------------------------------------------------------------------ the op, as a user's module would write it
@dataclasses.dataclass(frozen=True)
class Swish(Op):
    """``x * sigmoid(x)``, per element."""

    x: Value


class SwishRules(OpRules):
    row_local = True  # elementwise: compaction may compute it per pair

    def interpret(self, op: Swish, run: Any) -> torch.Tensor:
        x = run.value(op.x)
        return x * torch.sigmoid(x)

    def adjoint(self, op: Swish, g: Value, ad: Any) -> None:  # d/dx = sigmoid(x) + x sigmoid'(x)
        x = op.x
        sig = ad.emit(Unary, x.domain, x.heads, x.dim, op="sigmoid", x=x)
        slope = ad.emit(Unary, x.domain, x.heads, x.dim, op="sigmoid_grad", x=x)
        ds = ad.emit(Binary, x.domain, x.heads, x.dim, op="add", a=sig, b=ad.mul(x, slope))
        ad.accumulate(x, ad.mul(g, ds))

    def inline(self, op: Swish, ctx: Any) -> Expr:
        h, d = op.out.heads, op.out.dim
        x = ctx.expr(op.x)
        return BinaryE(h, d, "mul", x, UnaryE(h, d, "sigmoid", x))

    def flops(self, op: Swish, rows: Any) -> int:
        return 9 * rows(op.out.domain) * op.out.heads * op.out.dim  # a sigmoid (8, as the counts do) and a product


@pytest.fixture(scope="module", autouse=True)
def swish() -> Iterator[None]:
    register_op(Swish, SwishRules(), "swish")
    yield
    unregister_op(Swish)


def swish_conv(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """``h'_i = W_0 h_i + sum_r mean_j swish(W_r h_j)``."""
    p = ProgramBuilder("swish_conv", in_dim)
    msg = p.op(Swish, "edge", 1, out_dim, x=p.typed_linear(p.src(p.x), "weight", out=(1, out_dim), by="rel"))
    return p.finish(p.add(p.linear(p.x, "root", out=(1, out_dim), bias="bias"),
                          p.aggregate(p.mul(msg, p.inv_dst_rel_degree()))))


def concat_conv(in_dim: int, out_dim: int, heads: int = 1) -> Program:
    """``h'_i = sum_r mean_j [W_r h_j | gelu(V_r h_j)] U``: a concatenation inside a message."""
    p = ProgramBuilder("concat_conv", in_dim)
    src = p.src(p.x)
    both = p.concat(p.typed_linear(src, "w_a", out=(1, 3), by="rel"), p.gelu(p.typed_linear(src, "w_b", out=(1, 5), by="rel")))
    agg = p.aggregate(p.mul(both, p.inv_dst_rel_degree()))
    return p.finish(p.linear(agg, "w_out", out=(1, out_dim)))


GRAPH = random_graph((12, 18), num_relations=3, num_edges=140, seed=2)


def _autograd(program: Program, x: torch.Tensor, params: dict[str, torch.Tensor], dout: torch.Tensor):
    x = x.clone().requires_grad_(True)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    out = Interpreter(program, GRAPH).run(x, leaves).output
    grads = torch.autograd.grad(out, [x, *leaves.values()], dout)
    return out.detach(), grads[0], dict(zip(leaves, grads[1:]))


def _case(program: Program, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    params = random_params(program, GRAPH, seed=seed)
    x = torch.randn(GRAPH.num_nodes(), program.in_dim, generator=gen, dtype=torch.float64)
    dout = torch.randn(GRAPH.num_nodes(), program.out_dim, generator=gen, dtype=torch.float64)
    return x, params, dout


# ------------------------------------------------------------------ the acceptance test
@pytest.mark.parametrize("build", [swish_conv, concat_conv])
def test_the_adjoint_equals_autograd_of_the_interpreted_forward(build: Any) -> None:
    program = build(6, 4)
    x, params, dout = _case(program)
    out, dx, dparams = _autograd(program, x, params, dout)
    for save in SAVE.choices:
        run = Interpreter(adjoint(program, save=save), GRAPH).run(x, params, dout)
        assert torch.allclose(run.output, out, atol=1e-12) and torch.allclose(run.input_grad, dx, atol=1e-10)
        for name, g in dparams.items():
            assert torch.allclose(run.param_grads[name], g, atol=1e-10), (save, name)


@pytest.mark.parametrize("build", [swish_conv, concat_conv])
def test_the_layer_trains_on_the_cpu_backend(build: Any) -> None:
    """The generated C of the forward and of the backward, through the layer as a user calls it, against
    the same layer on the torch executor (float64)."""
    program = build(6, 4)
    torch.manual_seed(0)
    ref = Layer(program, GRAPH, dtype=torch.float64, backend="reference")
    cpu = Layer(program, GRAPH, backend="cpu", mode="training")
    cpu.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(GRAPH.num_nodes(), 6, dtype=torch.float64)
    xs = [x.clone().requires_grad_(True), x.float().requires_grad_(True)]
    outs = [ref(xs[0]), cpu(xs[1])]
    dout = torch.randn_like(outs[0])
    outs[0].backward(dout)
    outs[1].backward(dout.float())
    assert cpu.backward_kind == "generated"
    assert torch.allclose(outs[1].double(), outs[0], atol=1e-4)
    assert torch.allclose(xs[1].grad.double(), xs[0].grad, atol=1e-4)
    for (name, p), q in zip(ref.named_parameters(), cpu.parameters()):
        assert torch.allclose(q.grad.double(), p.grad, atol=1e-4), name


@pytest.mark.parametrize("build", [swish_conv, concat_conv])
def test_the_generated_cuda_trains_on_the_emulator(build: Any) -> None:
    """The CUDA code of the training program (forward and backward kernels), run on the CPU emulator,
    against the torch executor of the same kernels in float64; and it compiles with NVRTC."""
    from rgtune.codegen.cuda import CudaBackend
    from rgtune.codegen.cuda.emulate import EmulatedProgram, find_cxx
    from rgtune.codegen.cuda.generate import generate

    if find_cxx() is None:
        pytest.skip("no C++ compiler for the CUDA emulator")
    program = build(6, 4)
    point = SearchSpace(program, GRAPH, "cuda", mode="training").compile({})
    assert point.valid, point.problems
    kp = point.kernels
    params = init_params(kp, GRAPH, dtype=torch.float64, seed=1)
    x = torch.randn(GRAPH.num_nodes(), 6, dtype=torch.float64)
    dout = torch.randn(GRAPH.num_nodes(), 4, dtype=torch.float64)
    expected = ReferenceExecutor(kp, GRAPH).run_training(x, params, dout)
    got = EmulatedProgram(kp, generate(kp, point.config).units, GRAPH).run_training(
        x.float(), {k: v.float() for k, v in params.items()}, dout.float())
    assert torch.allclose(got[0].double(), expected[0], atol=1e-4)
    assert torch.allclose(got[1].double(), expected[1], atol=1e-4)
    for name, g in expected[2].items():
        assert torch.allclose(got[2][name].double(), g, atol=1e-4), name
    ok, why = CudaBackend.compile_available()
    if ok:
        assert CudaBackend().compile_only(kp, point.config, archs=("sm_90",)).cubins


def test_the_ops_rules_are_what_counts_and_compaction_read() -> None:
    program = swish_conv(6, 4)
    (op,) = [o for o in program.ops if isinstance(o, Swish)]
    assert rules_of(op).row_local and str(op).startswith(f"{op.out.name} = swish(")
    plain = program_flops(program, GRAPH)
    assert plain - program_flops(_without_swish(program), GRAPH) == 9 * GRAPH.num_edges() * 4
    # row-local: its edge value depends on (src, rel) alone, so compaction may compute it per source pair
    compiled = compile_program(program, {"compact.src": "pair"}, GRAPH)
    assert any(isinstance(o, Swish) and o.out.domain == "src_pair" for o in compiled.program.ops)


def _without_swish(program: Program) -> Program:
    p = ProgramBuilder("plain", program.in_dim)
    msg = p.typed_linear(p.src(p.x), "weight", out=(1, program.out_dim), by="rel")
    return p.finish(p.add(p.linear(p.x, "root", out=(1, program.out_dim), bias="bias"),
                          p.aggregate(p.mul(msg, p.inv_dst_rel_degree()))))


def test_an_op_without_rules_is_named_in_the_error() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unknown(Op):
        x: Value

    op = Unknown(Value("%0", "node", 1, 4), Value("x", "node", 1, 4))
    with pytest.raises(IRError, match="op Unknown has no rules; register them"):
        rules_of(op)
    with pytest.raises(IRError, match="not an Op subclass"):
        register_op(int, SwishRules(), "int")  # type: ignore[arg-type]
