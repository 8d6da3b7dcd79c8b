"""The README's examples run as written: tune, load the tuned layer and train it; export it and load the folder."""

from __future__ import annotations

import re
import shlex
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


@pytest.mark.slow
def test_the_training_example_runs_as_written(tmp_path, monkeypatch, capsys):
    from rgtune.cli import main

    monkeypatch.chdir(tmp_path)  # results.db and the export folder land here
    blocks = _blocks("Train with a tuned layer")
    assert [lang for lang, _ in blocks] == ["python", "bash", "python"]
    namespace: dict = {}
    exec(compile(blocks[0][1], "README.md (training)", "exec"), namespace)
    assert "with the schedule of trial" in capsys.readouterr().out
    layer = namespace["layer"]
    assert layer.provenance["trial_id"] is not None  # the tuned schedule, not the default
    command = shlex.split(blocks[1][1], comments=True)
    assert command[0] == "rgtune" and main(command[1:]) == 0
    exec(compile(blocks[2][1], "README.md (export)", "exec"), namespace)
    exported = namespace["layer"]
    assert exported.config == layer.config and exported.provenance["trial_id"] == layer.provenance["trial_id"]


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
