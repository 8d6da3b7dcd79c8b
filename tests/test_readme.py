"""The README's examples run as written: tune, load the tuned layer and train it; export it and load the folder."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
MINIBATCH_GUIDE = README.parent / "docs" / "minibatch.md"


def _blocks(section: str) -> list[tuple[str, str]]:
    """``(language, code)`` of the fenced blocks under the README heading ``section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```(\w+)\n(.*?)```", text[start:end if end > 0 else None], flags=re.S)


def _run_as_file(code: str, folder: Path, name: str) -> str:
    """Run ``code`` saved as ``folder/name`` in a fresh Python process, as a user runs an example; its stdout."""
    path = folder / name
    path.write_text(code)
    done = subprocess.run([sys.executable, str(path)], cwd=folder, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_training_example_runs_as_written(tmp_path, monkeypatch):
    """Each Python block saved as a script and run in a fresh process (no ``if __name__ == "__main__":`` guard:
    the tuner's worker does not run the user's script again), the bash block with the CLI."""
    from rgtune.cli import main

    monkeypatch.chdir(tmp_path)  # results.db and the export folder land here
    blocks = _blocks("Train with a tuned layer")
    assert [lang for lang, _ in blocks] == ["python", "bash", "python"]
    out = _run_as_file(blocks[0][1], tmp_path, "train.py")
    trial = re.search(r"with the schedule of record #(\d+), backward generated", out)
    assert trial is not None, out  # the tuned schedule, not the default
    command = shlex.split(blocks[1][1], comments=True)
    assert command[0] == "rgtune" and main(command[1:]) == 0
    setup = blocks[0][1][:blocks[0][1].index("rgtune.tune(")]  # the imports and the graph, without tuning again
    out = _run_as_file(setup + blocks[2][1] + "print(layer.provenance['trial_id'], layer.config)\n", tmp_path,
                       "export.py")
    assert out.split()[0] == trial.group(1)


def test_the_minibatch_guide_trains_as_written():
    text = MINIBATCH_GUIDE.read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    namespace: dict = {}
    exec(compile(code, "docs/minibatch.md", "exec"), namespace)
    layers, loss = namespace["layers"], namespace["loss"]
    assert loss.requires_grad and bool(loss.isfinite())
    # every parameter of both layers received a gradient through the sampled blocks
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for m in layers for p in m.parameters())


def test_the_minibatch_guides_sampler_lookup_runs_as_written(tmp_path, monkeypatch):
    """The lookup of a schedule tuned for a sampler, on the guide's graph: with no database here, the default
    schedule and a warning that names the command tuning for that sampler."""
    from rgtune.runtime._lookup import TunedScheduleWarning

    monkeypatch.chdir(tmp_path)  # no results.db
    text = MINIBATCH_GUIDE.read_text()
    first, lookup = re.findall(r"```python\n(.*?)```", text, flags=re.S)[:2]
    graph_code = first[:first.index("feats =")]  # the guide's graph, not its training loop
    namespace: dict = {}
    exec(compile(graph_code, "docs/minibatch.md", "exec"), namespace)
    with pytest.warns(TunedScheduleWarning, match="--batches neighbor:fanout=15x10,batch_size=1024"):
        exec(compile(lookup, "docs/minibatch.md (tuned for a sampler)", "exec"), namespace)
    assert [layer.provenance["source"] for layer in namespace["layers"]] == ["default", "default"]
