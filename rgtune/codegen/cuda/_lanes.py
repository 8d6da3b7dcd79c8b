"""Per-lane feature chunks for the traversal templates: vector loads, warp-reduced inner products.

A lane (or thread) handles ``vector_width`` consecutive features ``(h, d0 .. d0 + vw - 1)`` of a
row. :func:`chunk` loads every feature-indexed operand once as a ``float2``/``float4`` and
evaluates the expressions per component; :func:`warp_inner` computes the inner products (and the
sums over features, a training program's) of an edge's expressions with the whole warp (lanes over
the reduced dimension, shuffle reduction);
:func:`store_vec` / :func:`atomic_vec` write a chunk back (vector ``atomicAdd`` on sm_90+).

Example:
    >>> print("\\n".join(atomic_vec("out[o]", ["a", "b"], "")))
    #if __CUDA_ARCH__ >= 900  // vector atomicAdd on global float2/float4
    atomicAdd(reinterpret_cast<float2*>(&out[o]), make_float2(a, b));
    #else
    atomicAdd(&out[o], a);
    atomicAdd(&out[o] + 1, b);
    #endif
"""

from __future__ import annotations

from rgtune.codegen.cfamily import c_load, c_store
from rgtune.codegen.cuda._expr import Emitter, warp_reductions
from rgtune.ir.kernels import ConcatE, Expr, InnerE, KernelProgram, Load, ParamLoad, ReduceE, SliceE, expr_str

_COMP = "xyzw"


def vector_leaves(exprs: list[Expr], dim: int, vw: int, kp: KernelProgram) -> list[Expr]:
    """Loads that can be read ``vw`` features at a time: feature-varying, aligned, not reduced (inside an
    inner product, a sum or a concatenation a load is read at other features than the chunk's), not
    guarded (a destinations' buffer read where the row may be past them: scalar loads that test it)."""
    if vw == 1:
        return []
    out: list[Expr] = []

    def visit(e: Expr) -> None:
        if isinstance(e, (InnerE, ConcatE, ReduceE, SliceE)):
            return  # indexed by the reduction variable / shifted: scalar loads
        if isinstance(e, Load) and not e.guard and e.dim == dim and dim % vw == 0 and e not in out:
            out.append(e)
        elif isinstance(e, ParamLoad) and e.dim == dim and dim % vw == 0 and e not in out:
            size = 1
            for n in kp.param_shapes[e.param]:
                size *= n
            if size % vw == 0:
                out.append(e)
        for c in e.children():
            visit(c)

    for e in exprs:
        visit(e)
    return out


class _Component:
    c = 0


def chunk(em: Emitter, exprs: list[Expr], dim: int, vw: int, kp: KernelProgram,
           indent: str) -> tuple[list[str], list[list[str]]]:
    """Code for features ``(h, d0 .. d0 + vw - 1)``: vector loads, then each expression's values.

    Returns the statements and ``values[i][c]``, the C expression of ``exprs[i]`` at ``d0 + c``.
    """
    lines: list[str] = []
    comp = _Component()
    for n, leaf in enumerate(vector_leaves(exprs, dim, vw, kp)):
        storage = em.storage.get(leaf.buffer, "float32") if isinstance(leaf, Load) else "float32"
        # a 16-bit row: vw elements in one 4- or 8-byte load, each widened as it is used
        vt = f"float{vw}" if storage == "float32" else f"rg_16x{vw}"
        addr = em.lvalue(leaf, "h", "d0") if isinstance(leaf, Load) else em.element(leaf, "h", "d0")
        lines.append(f"{indent}const {vt} L{n} = *reinterpret_cast<const {vt}*>(&{addr});")
        em.leaf_subst[leaf] = (lambda n, storage: lambda h, d: c_load(storage, f"L{n}.{_COMP[comp.c]}"))(n, storage)
    values: list[list[str]] = [[] for _ in exprs]
    for c in range(vw):
        comp.c = c
        d = "d0" if c == 0 else f"(d0 + {c})"
        for i, e in enumerate(exprs):
            values[i].append(em.element(e, "h", d))
    # taken once: an inner product or sum that components or expressions share is computed once
    lines.extend(indent + st for st in em.take_statements())
    return lines, values


def warp_inner(em: Emitter, exprs: list[Expr], indent: str, prefix: str = "ip") -> list[str]:
    """Every inner product (and sum over features) of ``exprs`` reduced by the whole warp; later uses read
    ``ipN[h]``. Every lane of the warp must run the emitted code (shuffles)."""
    lines: list[str] = []
    seen: list[Expr] = []
    for e in exprs:
        for x in warp_reductions(e):
            if x in seen:
                continue
            n = len(seen)
            seen.append(x)
            if isinstance(x, InnerE):
                dk = max(x.a.dim, x.b.dim)
                a = em.element(x.a, "hh", "kk")
                b = em.element(x.b, "hh", "kk")
                update = f"s = fmaf({a}, {b}, s);"
            else:  # a sum over features
                assert isinstance(x, ReduceE)
                dk = x.x.dim
                update = f"s += {em.element(x.x, 'hh', 'kk')};"
            stmts = em.take_statements()
            lines += [f"{indent}float {prefix}{n}[{x.heads}];  // {_short(x)}: lanes over {dk}, warp reduction",
                      f"{indent}#pragma unroll",
                      f"{indent}for (int hh = 0; hh < {x.heads}; ++hh) {{",
                      f"{indent}  float s = 0.0f;",
                      f"{indent}  for (int kk = lane; kk < {dk}; kk += 32) {{"]
            lines += [f"{indent}    {st}" for st in stmts]
            lines += [f"{indent}    {update}",
                      f"{indent}  }}",
                      f"{indent}  {prefix}{n}[hh] = rg_warp_sum(s);",
                      f"{indent}}}"]
            em.subst[x] = (lambda n: lambda h, d: f"{prefix}{n}[{h}]")(n)
    # the loops use `hh`; when a product has one head its element is at hh = 0 already
    return lines


def _short(e: Expr) -> str:
    s = expr_str(e)
    return s if len(s) < 70 else s[:67] + "..."


def store_vec(target: str, vals: list[str], indent: str, op: str = "=", storage: str = "float32") -> list[str]:
    """``target[0 .. len(vals))`` (op)= vals, as one vector access when there are 2 or 4; ``storage``: the
    target's type (a 16-bit row is stored, rounded once, never added into: its sums stay float32)."""
    vw = len(vals)
    if storage != "float32":
        if op != "=":
            raise ValueError(f"a {storage} buffer is stored, never accumulated into ({op!r}): sums stay float32")
        vals = [c_store(storage, v) for v in vals]
        if vw == 1:
            return [f"{indent}{target} = {vals[0]};"]
        return [f"{indent}*reinterpret_cast<rg_16x{vw}*>(&{target}) = rg_16x{vw}{{{', '.join(vals)}}};"]
    if vw == 1:
        return [f"{indent}{target} {op} {vals[0]};"]
    vt = f"float{vw}"
    if op == "=":
        return [f"{indent}*reinterpret_cast<{vt}*>(&{target}) = make_{vt}({', '.join(vals)});"]
    lines = [f"{indent}{{",
             f"{indent}  {vt}* o = reinterpret_cast<{vt}*>(&{target});",
             f"{indent}  {vt} cur = *o;"]
    lines += [f"{indent}  cur.{_COMP[c]} += {v};" for c, v in enumerate(vals)]
    lines += [f"{indent}  *o = cur;", f"{indent}}}"]
    return lines


def atomic_vec(target: str, vals: list[str], indent: str) -> list[str]:
    vw = len(vals)
    scalar = [f"{indent}atomicAdd(&{target}{' + ' + str(c) if c else ''}, {v});" for c, v in enumerate(vals)]
    if vw == 1:
        return scalar
    vt = f"float{vw}"
    return ["#if __CUDA_ARCH__ >= 900  // vector atomicAdd on global float2/float4",
            f"{indent}atomicAdd(reinterpret_cast<{vt}*>(&{target}), make_{vt}({', '.join(vals)}));",
            "#else"] + scalar + ["#endif"]
