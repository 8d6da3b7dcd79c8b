"""Small helpers for writing readable C: an indenting line buffer and one kernel function.

Example:
    >>> f = CFunction("rg_demo", "a demo")
    >>> f.use("v1", writes=True)
    'v1'
    >>> f.body.line("v1[0] = 1.0f;")
    >>> print(f.render({"v1": "float*"}))
    /* a demo */
    void rg_demo(const rg_ctx* c)
    {
        float* restrict v1 = c->v1;
        v1[0] = 1.0f;
    }
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping


class Lines:
    """Lines of C with the current indentation."""

    def __init__(self, indent: int = 1) -> None:
        self.lines: list[str] = []
        self.indent = indent

    def line(self, text: str = "") -> None:
        for part in text.split("\n"):
            # pragmas stay at the current indentation: valid C, and easier to read
            self.lines.append(("    " * self.indent + part) if part else "")

    def extend(self, texts: list[str]) -> None:
        for t in texts:
            self.line(t)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        """``head {`` ... ``}`` (a head ending in a newline, like a pragma, puts the brace on its own line)."""
        self.line(head + "{" if head.endswith("\n") else head + " {")
        self.indent += 1
        try:
            yield
        finally:
            self.indent -= 1
            self.line("}")

    def text(self) -> str:
        return "\n".join(self.lines)


class CFunction:
    """One exported kernel function ``void name(const rg_ctx* c)``; context fields become locals."""

    def __init__(self, name: str, comment: str) -> None:
        self.name = name
        self.comment = comment
        self.body = Lines(1)
        self._fields: dict[str, bool] = {}  # field -> written
        self.statics: list[str] = []  # helper definitions this function needs (emitted before it)

    def use(self, field: str, writes: bool = False) -> str:
        """Read (or write) context field ``field`` through a local of the same name."""
        self._fields[field] = self._fields.get(field, False) or writes
        return field

    @property
    def fields(self) -> dict[str, bool]:
        return dict(self._fields)

    def render(self, field_types: Mapping[str, str]) -> str:
        decls = []
        for name in sorted(self._fields):
            ctype = field_types[name]
            if ctype.endswith("*"):
                base = ctype if self._fields[name] or ctype.startswith("const ") else "const " + ctype
                decls.append(f"    {base} restrict {name} = c->{name};")
            else:
                decls.append(f"    const {ctype} {name} = c->{name};")
        comment = "\n".join(f" * {ln}" if ln else " *" for ln in self.comment.splitlines())
        head = f"/* {self.comment} */" if "\n" not in self.comment else f"/*\n{comment}\n */"
        return "\n".join([head, f"void {self.name}(const rg_ctx* c)", "{", *decls, self.body.text(), "}"])
