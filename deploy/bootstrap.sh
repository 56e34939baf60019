#!/usr/bin/env bash
# Sets up this checkout on a Debian machine: Python >= 3.11 with venv, the libpython the
# Triton Python-backend stub links against, headless Chromium (for the HTML report test),
# and the project in .venv (editable, with its dev tools). Idempotent; run as root (it uses
# apt-get when something is missing).
# The lab's own packages (Slurm, munge, nginx, MariaDB) are installed by `stb lab up`.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() {
    [ "$apt_updated" = 1 ] || { as_root apt-get update -qq; apt_updated=1; }
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    apt_install python3 python3-venv python3-dev
    PY=python3
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "bootstrap: Python >= 3.11 is needed, $PY is $("$PY" --version)" >&2; exit 1; }
ver=$("$PY" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
"$PY" -m venv --help >/dev/null 2>&1 && "$PY" -c 'import ensurepip' 2>/dev/null \
    || apt_install "python${ver}-venv"
# Triton's Python-backend stub (from the nvidia-pytriton wheel) links libpython<ver>.so.
if ! ldconfig -p | grep -q "libpython${ver}\.so\.1\.0"; then
    apt_install "libpython${ver}"
fi
# Headless Chromium, with a font for the page's text, renders the HTML finance report in
# tests/unit/test_report_chromium.py.
if ! command -v chromium >/dev/null || [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
    apt_install chromium fonts-dejavu-core
fi
# A Lua 5.1 interpreter runs slurm_plugins/job_submit.lua in tests/unit/test_slurm_plugins.py
# (Slurm's job_submit/lua plugin embeds liblua 5.1).
if ! command -v lua5.1 >/dev/null; then
    apt_install lua5.1
fi
# The linter ShellCheck checks the Triton job script (deploy/slurm/triton-server.sbatch)
# for every runtime in tests/unit/test_triton_runtimes.py.
if ! command -v shellcheck >/dev/null; then
    apt_install shellcheck
fi

if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,lab]'
echo "bootstrap: ready (.venv, Python $ver); next: .venv/bin/stb lab up"
