# Sourced by scripts/run and scripts/test: makes .venv with rgtune installed (once), and activates it.
# torch is pinned by constraints.txt so that a CPU machine never pulls CUDA builds of torch.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
stamp=".venv/.rgtune-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "[rgtune] setting up .venv (first run only) ..." >&2
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip >&2
    .venv/bin/python -m pip install -q -c constraints.txt "torch==2.13.0" >&2
    .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,pyg,dgl,nvrtc,plot]" >&2
    touch "$stamp"
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export DGLBACKEND=pytorch
# Offline copies of the real datasets sit beside the checkout in CI (and on the development
# machines); elsewhere the loaders use the user cache and download what is missing.
if [ -z "${RGTUNE_DATA_DIR:-}" ] && [ -d ../shared/datasets ]; then
    export RGTUNE_DATA_DIR="$(cd ../shared/datasets && pwd)"
fi
