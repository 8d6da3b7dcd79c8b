"""``export --force`` replaces an earlier export by renames: a failure or a kill at any step leaves an export
in place (or, after a kill between the two renames, aside, where the next export puts it back), and the next
export cleans what an interrupted one left beside the folder."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from rgtune.runtime import Layer, TunedScheduleWarning, export_layer, load_tuned

export_module = importlib.import_module("rgtune.runtime.export")  # rgtune.runtime.export is also the function
GRAPH = "synthetic:custom,nodes=60,edges=300,ntypes=2,rels=3,seed=1"


@pytest.fixture(scope="module")
def layer() -> Layer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TunedScheduleWarning)
        return load_tuned("rgcn", GRAPH, 8, 8, db=None, backend="reference")


def _which(out: Path) -> str:
    """Which export is in ``out``: the ``db`` it was written with stands for its identity here."""
    return json.loads((out / "provenance.json").read_text())["db"]


def _beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def _once(real: Callable[..., Any], when: Callable[..., bool]) -> Callable[..., Any]:
    """``real``, but the first call for which ``when(*args)`` holds raises KeyboardInterrupt (a Ctrl-C there)."""
    fired = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        if not fired and when(*args):
            fired.append(args)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return patched


def test_an_interrupt_before_the_new_export_is_in_place_keeps_the_old_one(tmp_path, layer, monkeypatch) -> None:
    out = export_layer(layer, tmp_path / "tuned", db="old")
    into_place = _once(os.rename, lambda src, dst: Path(dst) == out)  # the new folder's rename (or replace) into out
    monkeypatch.setattr(export_module.os, "rename", into_place)
    monkeypatch.setattr(export_module.os, "replace", into_place)
    with pytest.raises(KeyboardInterrupt):
        export_layer(layer, out, overwrite=True, db="new")
    monkeypatch.undo()
    assert _which(out) == "old" and _beside(out) == []


def test_an_interrupt_after_the_new_export_is_in_place_leaves_the_new_one(tmp_path, layer, monkeypatch) -> None:
    out = export_layer(layer, tmp_path / "tuned", db="old")
    monkeypatch.setattr(export_module.shutil, "rmtree", _once(shutil.rmtree, lambda path, *a: True))
    with pytest.raises(KeyboardInterrupt):
        export_layer(layer, out, overwrite=True, db="new")
    monkeypatch.undo()
    assert _which(out) == "new"
    export_layer(layer, out, overwrite=True, db="next")  # cleans the old folder the interrupt left aside
    assert _which(out) == "next" and _beside(out) == []


def test_a_kill_between_the_renames_is_repaired_by_the_next_export(tmp_path, layer) -> None:
    out = export_layer(layer, tmp_path / "tuned", db="old")
    script = textwrap.dedent(f"""
        import os, warnings
        from pathlib import Path
        from rgtune.runtime import export_layer, load_tuned

        out, real = Path({str(out)!r}), os.rename

        def killed(src, dst):  # the process dies as the new export is about to be renamed into place
            if Path(dst) == out:
                os._exit(9)
            real(src, dst)

        os.rename = os.replace = killed
        warnings.simplefilter("ignore")
        layer = load_tuned("rgcn", {GRAPH!r}, 8, 8, db=None, backend="reference")
        export_layer(layer, out, overwrite=True, db="killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr
    with pytest.raises(FileExistsError, match="already holds an export"):  # the old export is back: not replaced
        export_layer(layer, out, db="without --force")
    assert _which(out) == "old" and _beside(out) == []  # the killed export's folders are gone
    export_layer(layer, out, overwrite=True, db="new")
    assert _which(out) == "new" and _beside(out) == []
