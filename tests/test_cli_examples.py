"""Every command line the documentation shows runs here, or at least parses, so a renamed flag is caught.

The examples are collected, not copied: the fenced ``bash`` blocks of README.md, the commands and
``tune`` flags in docs/tuner.md's inline code, and the examples of ``rgtune --help`` and of each
command's ``--help``. Each runs in one folder whose ``results.db`` holds what the README's
training example tunes (rgcn, hidden 16, training mode) and the tune example's workload (hgt), as written
except ``--trials``, which is 1 (and ``--confirm 0``): the flags are the documented ones, the
budget is not. Parsed only, with the command's own parser: ``bench`` (times PyG and DGL, writes
BENCHMARKS.md), anything on a GPU backend or a PostgreSQL server when there is none, and the
fragments of docs/tuner.md (``tune --timing paired``: a flag in a sentence, completed with a
workload).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from rgtune.cli import build_parser, command_parser, main
from rgtune.codegen.base import available_backends

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ["--model", "hgt", "--dataset", "aifb"]
#: placeholders in docs/tuner.md's flags (``--confirm K``) and the value each stands for here
PLACEHOLDERS = {"D": "aifb", "K": "2", "N": "2", "R": "2", "GB": "4", "X": "3", "F": "0.25"}
CUDA = available_backends().get("cuda", (False, ""))[0]


# ---------------------------------------------------------------------- collecting the examples
def _command(line: str) -> list[str]:
    """A shown command line as argv: comments dropped, ``scripts/run`` (the project's environment) too,
    placeholders (``--holdout D``) filled in."""
    argv = [PLACEHOLDERS.get(w, w) for w in shlex.split(line, comments=True)]
    return argv[1:] if argv[:1] == ["scripts/run"] else argv


def readme_commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [argv for block in blocks for line in block.splitlines() if (argv := _command(line))]


def tuner_doc_spans() -> list[str]:
    """The inline code of docs/tuner.md that is a command (``tune ...``, ``rgtune ...``) or a flag (``--x v``)."""
    spans = re.findall(r"`([^`\n]+)`", (ROOT / "docs" / "tuner.md").read_text())
    return [s for s in spans if s.startswith(("tune", "rgtune ", "--"))]


def help_examples() -> list[list[str]]:
    """The examples in ``rgtune --help`` and in every command's ``--help``."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    out = []
    for argv in ([], *([name] for name in sub.choices)):
        text = _help(argv)
        for part in re.split(r"\n(?=\S)", text):  # the help's paragraphs; the examples follow "Example(s):"
            if part.startswith("Example"):
                lines = part.split(":", 1)[1].splitlines()
                out += [_command(line) for line in lines if line.strip().startswith(("tune ", "rgtune "))]
    return out


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        mp.setenv("COLUMNS", "1000")  # argparse wraps an epilog at the terminal's width
        main([*argv, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def documented() -> list[list[str]]:
    """Every shown command line, once."""
    seen, out = set(), []
    for argv in [*readme_commands(), *help_examples(),
                 *(_command(s) for s in tuner_doc_spans() if not s.startswith("--"))]:
        if tuple(argv) not in seen:
            seen.add(tuple(argv))
            out.append(argv)
    return out


# ---------------------------------------------------------------------- running one
def rgtune_argv(argv: list[str]) -> list[str]:
    """``tune ...`` is ``rgtune tune ...``: argv for :func:`rgtune.cli.main`."""
    assert argv[0] in ("tune", "rgtune"), argv
    return argv[1:] if argv[0] == "rgtune" else ["tune", *argv[1:]]


def why_not_run(args: list[str]) -> str | None:
    """Why a command (argv of :func:`main`) is only parsed here; None when it runs."""
    values = dict(zip(args, args[1:]))
    if args[0] == "bench":
        return "times PyG and DGL for minutes and writes BENCHMARKS.md"
    if args[0] == "tune" and "--model" not in args:
        return "a fragment of a sentence"
    if values.get("--backend") == "cuda" and not CUDA and args[0] != "show":
        return "needs a GPU"
    if "postgresql" in values.get("--db", ""):
        return "needs a PostgreSQL server"
    if args[0] == "costmodel" and "--history" in args:
        return ("evaluates the frozen history: tests/test_costmodel_frozen.py does, and tests/test_costmodel.py runs "
                "the command on a frozen file")
    if args[0] == "costmodel" and "--batches" in args:  # tests/test_costmodel_frozen.py ranks them (frozen sampler studies)
        return "needs a history of sampler studies (tune --batches), which the examples' database has not"
    return None


def shrunk(args: list[str]) -> list[str]:
    """The command with a budget for a test: ``tune`` runs 1 trial and no confirmation, quietly."""
    if args[0] != "tune":
        return args
    out = list(args)
    if "--trials" in out:
        out[out.index("--trials") + 1] = "1"
    else:
        out += ["--trials", "1"]
    return [*out, "--confirm", "0", "--quiet"]


def parse(args: list[str]) -> None:
    """Parse with the command's own parser, completing a fragment's required workload."""
    parser = command_parser(args[0])
    try:
        parser.parse_args(args[1:])
    except SystemExit:
        parser.parse_args([*args[1:], *WORKLOAD])


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


#: the commands (as run) that ran in this session: the same one again is only parsed
_RAN: set[tuple[str, ...]] = set()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder whose results.db has a trial of the README's training workload (in training mode) and of
    the tune example's."""
    folder = tmp_path_factory.mktemp("examples")
    with _cwd(folder):
        for workload in (["--model", "rgcn", "--dataset", "aifb", "--hidden", "16", "--mode", "training"], WORKLOAD):
            args = shrunk(["tune", *workload])
            assert main(args) == 0
            _RAN.add(tuple(args))
        yield folder


# ---------------------------------------------------------------------- the tests
def test_the_collection_finds_the_documented_examples() -> None:
    shown = {shlex.join(a) for a in documented()}
    for expected in ("tune --model hgt --dataset aifb", "rgtune datasets", "scripts/test",
                     "rgtune export --model rgcn --dataset aifb --hidden 16 --mode training -o tuned_rgcn/",
                     "rgtune show --model rgat --dataset aifb --set compact.src=pair --set fusion.softmax=full --source",
                     "rgtune export --model hgt --dataset aifb -o tuned_hgt/",
                     "rgtune costmodel --eval --db sqlite:///results.db --holdout aifb",
                     "rgtune bench --model rgcn --dataset aifb --tune-trials 30", "tune --timing paired"):
        assert expected in shown, f"{expected!r} is no longer collected from the documentation"
    assert len(tuner_doc_spans()) > 15


@pytest.mark.parametrize("argv", documented(), ids=shlex.join)
def test_a_documented_command_runs_or_parses(argv, workdir, capsys) -> None:
    if argv[0] == "scripts/test":  # the project's test command: it is this suite
        assert os.access(ROOT / "scripts" / "test", os.X_OK) and os.access(ROOT / "scripts" / "run", os.X_OK)
        return
    args = rgtune_argv(argv)
    parse(args)
    if why_not_run(args) is not None or tuple(shrunk(args)) in _RAN:
        return
    _RAN.add(tuple(shrunk(args)))
    # a command that reads a file of the repository (the frozen history) runs where the documentation runs it
    with _cwd(ROOT if any(a.startswith("tests/data/") for a in args) else workdir):
        rc, out, err = _main(shrunk(args), capsys)
    assert rc == 0 and "Traceback" not in err, err
    if "--json" in args:
        assert json.loads(out)
    if "--source" in args:
        assert "# generated: " in out


@pytest.mark.parametrize("span", tuner_doc_spans())
def test_a_flag_in_docs_tuner_md_is_a_flag_of_its_command(span) -> None:
    if not span.startswith("--"):
        return parse(rgtune_argv(_command(span)))
    from rgtune.tuner.study import SAMPLERS  # checked when tune runs, not by its parser

    parser = command_parser("tune")
    flag, *value = _command(span)
    assert flag in parser._option_string_actions, f"docs/tuner.md names {flag}, which `tune` does not have"
    for choice in (value[0].split("|") if value else []):  # `--sampler random|gp|cmaes`: each of them
        parsed = parser.parse_args([*WORKLOAD, flag, choice])
        if flag == "--sampler":
            assert parsed.sampler in SAMPLERS


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_show_source_prints_the_generated_files_of_either_backend(backend, capsys) -> None:
    rc, out, err = _main(["show", "--model", "rgat", "--dataset", "aifb", "--set", "compact.src=pair",
                          "--set", "fusion.softmax=full", "--source", "--backend", backend], capsys)
    assert rc == 0, err
    files = re.findall(r"^# generated: (\S+)$", out, flags=re.M)
    assert files and all(f.endswith(".cu" if backend == "cuda" else (".c", ".txt")) for f in files)


def test_tune_json_prints_the_summary_and_takes_in_and_out_sizes(tmp_path, capsys) -> None:
    """``tune --json`` (a script reads stdout), ``--in-dim``/``--out-dim`` (a layer whose sizes differ) and
    ``--threads``."""
    from rgtune.db import TrialDatabase

    db = tmp_path / "r.db"
    rc, out, err = _main(["tune", "--model", "rgcn", "--dataset", "synthetic:custom,nodes=80,edges=400,ntypes=2,rels=3",
                          "--in-dim", "8", "--out-dim", "4", "--backend", "reference", "--trials", "2", "--confirm", "0",
                          "--threads", "1", "--quiet", "--json", "--db", str(db)], capsys)
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["measured"] == 2 and summary["best_ms"] > 0 and summary["speedup"] is not None
    assert "best schedule" in err and "in_dim=8, out_dim=4" in err  # the readable summary, on stderr
    (w,) = TrialDatabase(str(db)).workloads()
    assert (w.in_dim, w.out_dim, w.id) == (8, 4, summary["workload_id"])


def test_the_parser_imports_no_torch_and_the_choices_it_spells_out_are_the_modules() -> None:
    """``rgtune --help`` and an argument error answer at once: building every command's parser imports none of
    torch, Optuna, scikit-learn or the measurement module (counted in a fresh process, not timed), and the
    choices the command line spells out for that are the ones the modules declare."""
    import subprocess
    import sys

    heavy = ("torch", "optuna", "sklearn", "rgtune.tuner.measure", "rgtune.costmodel")
    code = f"import sys; from rgtune.cli import build_parser; build_parser(); print([m for m in {heavy} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr

    from rgtune.bench import IMPLS
    from rgtune.cli import bench as bench_command
    from rgtune.cli import tune as tune_command
    from rgtune.tuner.measure import OBJECTIVES, TIMINGS
    from rgtune.tuner.verification import SAMPLE_ABOVE_EDGES

    assert (bench_command.IMPLS, bench_command.SAMPLE_ABOVE_EDGES) == (IMPLS, SAMPLE_ABOVE_EDGES)
    assert (tune_command.TIMINGS, tune_command.OBJECTIVES) == (TIMINGS, OBJECTIVES)
