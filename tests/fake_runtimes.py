"""Stand-ins for the container runtimes the Triton job can use (`apptainer`, pyxis's
`srun`), for machines that have neither (this one: Debian bookworm packages no
Apptainer, and pyxis needs enroot and a Slurm built with it).

Each fake records the argv and the environment it was given, refuses any flag outside
the set the job is meant to use (tests/unit/test_triton_runtimes.py holds that set with
each flag's documentation), checks that every bind source exists, then does what the
runtime would do with that command line: the fake apptainer empties the environment
for `--cleanenv`, adds each `--env`, and runs the command with the image's PATH; the
fake srun drops pyxis's `--container-*` options and runs the command with the image's
PATH first (pyxis keeps the host environment, the image's values winning), through the
real srun when one is named. "The image" is a folder on PATH holding `tritonserver`.

They prove the job script's logic (what it binds, passes and signals, and that the key
shim works through a wrapper), not the runtimes themselves.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

_APPTAINER = """#!/bin/bash
# fake apptainer (tests/fake_runtimes.py): records, checks, then runs the command.
set -euo pipefail
printf '%s\\0' "$@" > {log}/apptainer.argv
env -0 > {log}/apptainer.env
[ "${{1:-}}" = exec ] || {{ echo "fake apptainer: only 'exec' is used" >&2; exit 98; }}
shift
clean=0
envs=()
while [ $# -gt 0 ]; do
    case "$1" in
        --nv | --no-home) shift ;;
        --cleanenv) clean=1; shift ;;
        --bind)
            src=${{2%%:*}}
            [ -e "$src" ] || {{ echo "fake apptainer: no bind source $src" >&2; exit 97; }}
            shift 2 ;;
        --env) envs+=("$2"); shift 2 ;;
        -*) echo "fake apptainer: flag $1 is not in the job's table" >&2; exit 99 ;;
        *) break ;;
    esac
done
image=$1
shift
case "$image" in
    *://*) ;;
    *) [ -r "$image" ] || {{ echo "fake apptainer: no image $image" >&2; exit 96; }} ;;
esac
if [ "$clean" = 1 ]; then
    exec env -i PATH={path} "${{envs[@]}}" "$@"
fi
exec env PATH={path} "${{envs[@]}}" "$@"
"""

_SRUN = """#!/bin/bash
# fake srun with pyxis (tests/fake_runtimes.py): records, checks, then runs the command.
set -euo pipefail
printf '%s\\0' "$@" > {log}/srun.argv
env -0 > {log}/srun.env
kept=()
image=
while [ $# -gt 0 ]; do
    case "$1" in
        --container-image=*) image=${{1#*=}}; shift ;;
        --container-mounts=*)
            IFS=, read -r -a mounts <<< "${{1#*=}}"
            for m in "${{mounts[@]}}"; do
                src=${{m%%:*}}
                [ -e "$src" ] || {{ echo "fake srun: no mount source $src" >&2; exit 97; }}
            done
            shift ;;
        --no-container-mount-home | --no-container-entrypoint) shift ;;
        --ntasks=*) kept+=("$1"); shift ;;
        -*) echo "fake srun: flag $1 is not in the job's table" >&2; exit 99 ;;
        *) break ;;
    esac
done
[ -n "$image" ] || {{ echo "fake srun: no --container-image" >&2; exit 96; }}
export PATH={path}
real={real}
if [ -n "$real" ]; then
    exec "$real" "${{kept[@]}}" "$@"
fi
exec "$@"
"""


def install(
    bin_dir: Path,
    log_dir: Path,
    *,
    tritonserver: Path,
    image_path: tuple[str, ...] = ("/usr/bin", "/bin"),
    real_srun: str | None = None,
) -> Path:
    """Write the fake `apptainer` and `srun` into `bin_dir` (put it first on the job's
    PATH) and the image's `tritonserver` (a link to `tritonserver`) into a folder of its
    own; records go to `log_dir`. Returns the image's bin folder."""
    image_bin = bin_dir.parent / "image-bin"
    for d in (bin_dir, log_dir, image_bin):
        d.mkdir(parents=True, exist_ok=True)
    link = image_bin / "tritonserver"
    link.unlink(missing_ok=True)
    link.symlink_to(tritonserver)
    path = shlex.quote(":".join((str(image_bin), *image_path)))
    log = shlex.quote(str(log_dir))
    for name, text in (
        ("apptainer", _APPTAINER.format(log=log, path=path)),
        ("srun", _SRUN.format(log=log, path=path, real=shlex.quote(real_srun or ""))),
    ):
        f = bin_dir / name
        f.write_text(text)
        f.chmod(0o755)
    return image_bin


def recorded(log_dir: Path, runtime: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) the fake `runtime` ('apptainer' or 'srun') was given."""
    argv = (log_dir / f"{runtime}.argv").read_bytes().split(b"\0")[:-1]
    env: dict[str, str] = {}
    for item in (log_dir / f"{runtime}.env").read_bytes().split(b"\0"):
        if b"=" in item:
            key, _, value = item.decode(errors="replace").partition("=")
            env[key] = value
    return [a.decode() for a in argv], env


def path_with(bin_dir: Path) -> str:
    """This process's PATH with the fakes first."""
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
