"""The Triton job under each runtime (`[triton] runtime`: wheel, apptainer, pyxis).

- the configuration: what each runtime needs, refused with a message naming the fix;
- the job's environment from the launcher: same script, tags and node for every runtime;
- ShellCheck on the job script (bash) and on the part that runs inside the runtime (sh);
- the exact command lines the script hands each runtime, every flag checked against the
  table below of the runtimes' documented flags (with where each is documented);
- the key shim through a runtime: the key reaches tritonserver's arguments, never a
  command line, the runtime's environment or its arguments; a shim the runtime cannot
  load stops the job; the shim needs no glibc newer than 2.28 (the container's loads it).

No container runtime runs here: fake `apptainer` and `srun` (tests/fake_runtimes.py)
record what they get and run a fake tritonserver. That proves the script's logic, not
Apptainer or pyxis. tests/lab/test_triton_runtimes_lab.py runs the same fakes around the
real tritonserver as a Slurm job on the lab (readiness, the key, drain on SIGTERM).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.config import ConfigError, TritonJobConfig, load_config
from bridge.daemon.keyshim import build
from bridge.daemon.launcher import triton_job
from bridge.paths import key_shim_source, model_repository, triton_sbatch
from tests import fake_runtimes

KEY = "s3cr3t-KEY_value"
IMAGES = {
    "apptainer": "docker://nvcr.io/nvidia/tritonserver:24.10-py3",
    "pyxis": "nvcr.io#nvidia/tritonserver:24.10-py3",
}


@dataclass(frozen=True)
class Flag:
    """One flag the job script passes a runtime: its value's form (None: it takes no
    value), when it is passed, and where the runtime documents it."""

    runtime: str
    flag: str
    form: str | None
    when: str
    source: str


_BIND = r"/[^:,;=\s]*:/[^:,;=\s]*:(ro|rw)"
#: Every flag the script gives a runtime. Sources: the Apptainer CLI's own flag table
#: (apptainer/apptainer cmd/internal/cli/action_flags.go, the text of apptainer-exec(1));
#: the pyxis README's Usage section and its tests (NVIDIA/pyxis 0.24.0); srun(1) and
#: scancel(1) of Slurm 22.05 (Debian's man pages).
FLAGS = (
    Flag(
        "apptainer",
        "exec",
        None,
        "always",
        "apptainer-exec(1): `apptainer exec [exec options...] <container> <command>`; "
        "containers *.sif, docker://, oras://, library://",
    ),
    Flag("apptainer", "--nv", None, "always", "action_flags.go --nv: 'enable Nvidia support'"),
    Flag(
        "apptainer",
        "--cleanenv",
        None,
        "always",
        "action_flags.go -e/--cleanenv: 'clean environment before running container'; "
        "PATH and HOME never come from the host (internal/pkg/util/env/create.go)",
    ),
    Flag(
        "apptainer",
        "--no-home",
        None,
        "always",
        "action_flags.go --no-home: 'do NOT mount users home directory if /home is not "
        "the current working directory'",
    ),
    Flag(
        "apptainer",
        "--bind",
        _BIND,
        "always (repository, key file, shim; backends and extra binds when set)",
        "action_flags.go -B/--bind: 'spec has the format src[:dest[:opts]] ... 'ro' "
        "(read-only) or 'rw''; one spec per flag (a string array: paths may hold commas)",
    ),
    Flag(
        "apptainer",
        "--env",
        r"CUDA_VISIBLE_DEVICES=[^=]*",
        "when Slurm set CUDA_VISIBLE_DEVICES",
        "action_flags.go --env: 'pass environment variable to contained process'; a "
        "string-to-string map: a value with a single '=' is taken whole, commas and all "
        "(spf13/pflag stringToString.Set)",
    ),
    Flag(
        "pyxis",
        "--ntasks",
        r"1",
        "always",
        "srun(1) -n/--ntasks; a step is allocated all of the job's generic resources by "
        "default (srun(1), --gres NOTE), so the GPUs follow",
    ),
    Flag(
        "pyxis",
        "--container-image",
        r"\S+",
        "always",
        "pyxis README: `--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH`; a value "
        "starting with '/' or '.' is a squashfs file (pyxis_slurmstepd.c)",
    ),
    Flag(
        "pyxis",
        "--container-mounts",
        rf"{_BIND}(,{_BIND})*",
        "always",
        "pyxis README: `--container-mounts=SRC:DST[:FLAGS][,SRC:DST...]`; `:ro` as in "
        "tests/mounts.bats ('--container-mounts read-only directory')",
    ),
    Flag(
        "pyxis",
        "--no-container-mount-home",
        None,
        "always",
        "pyxis README: 'do not bind mount the user's home directory'",
    ),
    Flag(
        "pyxis",
        "--no-container-entrypoint",
        None,
        "always",
        "pyxis README: 'do not execute the entrypoint from the container image'",
    ),
)
#: What carries SIGTERM through each runtime (no flag: how the script starts it).
SIGNALS = {
    "apptainer": "exec: apptainer's starter takes the batch step's place; its master "
    "sends each signal it gets to the container's process when no terminal is attached "
    "(internal/pkg/runtime/engine/apptainer/monitor_linux.go MonitorContainer, "
    "prepare_linux.go checkSignalPropagation)",
    "pyxis": "srun turns a SIGTERM of its own into SIGKILL of its tasks (Slurm "
    "src/srun/libsrun/srun_job.c _srun_signal_mgr: 'forcing job termination'; seen on "
    "the lab), so srun stays a child of the batch shell, whose TERM trap runs "
    "`scancel --signal=TERM <job>`: 'signals other than SIGKILL are not sent to the "
    "batch step' (scancel(1) --batch), so it reaches the step's tasks and not srun",
}
#: Flags the script deliberately does not pass, and why.
NOT_USED = {
    "--container-env": "pyxis sets these before the image's entrypoint runs: LD_PRELOAD "
    "there would load the shim into the entrypoint's shell, which would take the key into "
    "its own arguments and pass it on tritonserver's command line",
    "--env LD_PRELOAD": "the shim is preloaded by `env` inside the runtime for the probe "
    "and tritonserver only, the same way for every runtime",
    "--containall": "a PID namespace and an init in front of tritonserver are not needed",
}


def _value_flags(runtime: str) -> dict[str, Flag]:
    return {f.flag: f for f in FLAGS if f.runtime == runtime}


def _parse(runtime: str, argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The runtime's own options in `argv` as (flag, value) pairs, and the rest (the
    image and command for apptainer, the command for srun)."""
    table = _value_flags(runtime)
    pairs: list[tuple[str, str | None]] = []
    i = 0
    if runtime == "apptainer":
        pairs.append((argv[0], None))  # exec
        i = 1
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if runtime == "pyxis":
            pairs.append((name, value if eq else None))
            i += 1
        elif table.get(name) is not None and table[name].form is not None:
            pairs.append((name, argv[i + 1]))
            i += 2
        else:
            pairs.append((name, None))
            i += 1
    return pairs, argv[i:]


# --- the configuration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"runtime": "apptainer"}, "needs triton.image"),
        ({"runtime": "pyxis"}, "needs triton.image"),
        ({"image": "x.sif"}, 'for runtime = "apptainer" or "pyxis"'),
        ({"binds": ("/data",)}, 'for runtime = "apptainer" or "pyxis"'),
        ({"runtime": "apptainer", "image": "nvcr.io/nvidia/tritonserver:24.10-py3"}, "neither"),
        ({"runtime": "apptainer", "image": "http://x/t.sif"}, "URI schemes"),
        (
            {"runtime": "pyxis", "image": "docker://nvcr.io/nvidia/tritonserver:24.10-py3"},
            "'nvcr.io#nvidia/tritonserver:24.10-py3'",
        ),
        ({"runtime": "pyxis", "image": "oras://r/t:1"}, "Docker images only"),
        ({"runtime": "pyxis", "image": "a,b"}, "holds ','"),
        ({"runtime": "pyxis", "image": IMAGES["pyxis"], "binds": ("data",)}, "absolute"),
        ({"runtime": "pyxis", "image": IMAGES["pyxis"], "binds": ("/a,b",)}, "may not hold"),
        ({"runtime": "pyxis", "image": IMAGES["pyxis"], "binds": ("/a:/b:/c",)}, "SRC[:DST]"),
        ({"runtime": "wheel-ish"}, "'wheel', 'apptainer' or 'pyxis'"),
    ],
)
def test_a_runtime_without_what_it_needs_is_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError) as err:
        TritonJobConfig.model_validate(fields)
    assert words in str(err.value)


def test_the_file_names_the_triton_section(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text('[triton]\nruntime = "apptainer"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert any(f == "triton" and "needs triton.image" in m for f, m in err.value.problems)


def test_images_and_binds_as_the_runtimes_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binds = ("/data", "/cache:/c:rw", "/models:/m")
    cfg = TritonJobConfig(runtime="pyxis", image=IMAGES["pyxis"], binds=binds)
    assert cfg.binds == ("/data:/data:ro", "/cache:/c:rw", "/models:/m:ro")
    assert cfg.image_reference == IMAGES["pyxis"]
    monkeypatch.chdir(tmp_path)  # a file image is taken from the working directory
    sif = TritonJobConfig(runtime="apptainer", image="images/triton.sif")
    assert sif.image_reference == str(tmp_path / "images" / "triton.sif")
    sqsh = TritonJobConfig(runtime="pyxis", image="./triton.sqsh")
    assert sqsh.image_reference == str(tmp_path / "triton.sqsh")
    assert (
        TritonJobConfig(runtime="apptainer", image=IMAGES["apptainer"]).image_reference
        == (IMAGES["apptainer"])
    )


# --- the job's environment ------------------------------------------------------


def _key_and_shim(tmp_path: Path) -> Path:
    key = tmp_path / "api.key"
    key.write_text(f"{KEY}\n")
    key.chmod(0o600)
    (tmp_path / "libstbkey.so").write_bytes(b"")
    return key


def test_every_runtime_gets_the_same_script_tags_and_node(tmp_path: Path) -> None:
    key = _key_and_shim(tmp_path)
    specs = {
        runtime: triton_job(
            TritonJobConfig(
                key_file=key,
                runtime=runtime,
                image=IMAGES.get(runtime),
                binds=("/scratch/cache",) if runtime != "wheel" else (),
            ),
            node="n3",
            lease=(3, 100),
        )
        for runtime in ("wheel", "apptainer", "pyxis")
    }
    shape = {(s.script, s.comment, s.name, s.nodelist, s.partition) for s in specs.values()}
    assert len(shape) == 1 and specs["pyxis"].comment == "stb:triton,stb:lease=3.100"
    assert specs["wheel"].env["STB_TRITON_RUNTIME"] == "wheel"
    assert "STB_TRITON_HOME" in specs["wheel"].env and "STB_TRITON_IMAGE" not in specs["wheel"].env
    for runtime in ("apptainer", "pyxis"):
        env = specs[runtime].env
        assert env["STB_TRITON_RUNTIME"] == runtime and env["STB_TRITON_IMAGE"] == IMAGES[runtime]
        assert env["STB_TRITON_BINDS"] == "/scratch/cache:/scratch/cache:ro"
        # the container's own tritonserver and backends, not the wheel's
        assert "STB_TRITON_HOME" not in env and "STB_TRITON_BACKENDS" not in env
    for spec in specs.values():
        assert not any(KEY in v for v in spec.env.values())


# --- ShellCheck -----------------------------------------------------------------


def _shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        pytest.skip("shellcheck is not installed (deploy/bootstrap.sh installs Debian's)")
    return found


def _in_runtime_part() -> str:
    """The part of the job script that /bin/sh runs inside the runtime."""
    text = triton_sbatch().read_text()
    match = re.search(r"in_runtime=\$\(cat <<'EOF'\n(.*?)\nEOF\n\)", text, re.S)
    assert match, "the job script's in-runtime part moved"
    return match.group(1)


def test_shellcheck_passes_the_job_script_and_its_in_runtime_part(tmp_path: Path) -> None:
    shellcheck = _shellcheck()
    script = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=style", str(triton_sbatch())],
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stdout
    part = tmp_path / "in-runtime.sh"
    part.write_text("#!/bin/sh\n" + _in_runtime_part() + "\n")
    inner = subprocess.run(
        [shellcheck, "--shell=sh", "--severity=style", str(part)], capture_output=True, text=True
    )
    assert inner.returncode == 0, inner.stdout
    # it can fail: a bashism in the in-runtime part (the images' /bin/sh is dash) is caught
    part.write_text("#!/bin/sh\n" + _in_runtime_part() + '\n[[ -n "$1" ]] && echo x\n')
    bad = subprocess.run([shellcheck, "--shell=sh", str(part)], capture_output=True, text=True)
    assert bad.returncode != 0 and "SC3010" in bad.stdout


# --- the command lines, through fake runtimes -------------------------------------


_FAKE_TRITON = """#!/bin/bash
printf "arg %s\\n" "$@"
printf "cmdline %s\\n" "$(tr "\\0" " " < /proc/$$/cmdline)"
printf "environ %s\\n" "$(tr "\\0" " " < /proc/$$/environ)"
"""


@dataclass
class Rig:
    home: Path
    shim: Path
    key: Path
    bin_dir: Path
    log_dir: Path
    backends: Path

    def env(self, runtime: str, **more: str) -> dict[str, str]:
        env = {
            "PATH": fake_runtimes.path_with(self.bin_dir),
            "STB_TRITON_RUNTIME": runtime,
            "STB_MODEL_REPO": str(model_repository()),
            "STB_TRITON_KEY_FILE": str(self.key),
            "STB_KEY_SHIM": str(self.shim),
            "STB_TRITON_BACKENDS": str(self.backends),
            "SLURMD_NODENAME": "n4",
            "SLURM_JOB_ID": "7",
            "STB_TRITON_ADDR": "127.0.0.1",
            "CUDA_VISIBLE_DEVICES": "0,1",
        }
        if runtime == "wheel":
            env["STB_TRITON_HOME"] = str(self.home)
        else:
            env["STB_TRITON_IMAGE"] = IMAGES[runtime]
        return env | more

    def run(self, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(triton_sbatch())], env=env, capture_output=True, text=True, timeout=30
        )


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the key shim")
    home = tmp_path / "triton"
    (home / "bin").mkdir(parents=True)
    binary = home / "bin" / "tritonserver"
    binary.write_text(_FAKE_TRITON)
    binary.chmod(0o755)
    shim = build(key_shim_source(), tmp_path / "shim" / "libstbkey.so")
    key = tmp_path / "keys" / "api.key"
    key.parent.mkdir()
    key.write_text(f"{KEY}\n")
    key.chmod(0o600)
    backends = tmp_path / "backends"
    backends.mkdir()
    bin_dir, log_dir = tmp_path / "fakes", tmp_path / "records"
    fake_runtimes.install(bin_dir, log_dir, tritonserver=binary)
    return Rig(home, shim, key, bin_dir, log_dir, backends)


def _server_lines(done: subprocess.CompletedProcess[str]) -> tuple[list[str], str, str]:
    lines = done.stdout.splitlines()
    args = [line[4:] for line in lines if line.startswith("arg ")]
    (cmdline,) = [line for line in lines if line.startswith("cmdline ")]
    (environ,) = [line for line in lines if line.startswith("environ ")]
    return args, cmdline, environ


def _expected_mounts(rig: Rig, *extra: str) -> list[str]:
    paths = (str(model_repository()), str(rig.key), str(rig.shim), str(rig.backends))
    return [f"{p}:{p}:ro" for p in paths] + list(extra)


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis"])
def test_the_runtime_gets_documented_flags_and_the_server_gets_the_key(
    rig: Rig, runtime: str
) -> None:
    binds = "/tmp:/scratch:rw"
    done = rig.run(rig.env(runtime, STB_TRITON_BINDS=binds))
    assert done.returncode == 0, done.stderr
    name = "apptainer" if runtime == "apptainer" else "srun"
    argv, runtime_env = fake_runtimes.recorded(rig.log_dir, name)
    pairs, rest = _parse(runtime, argv)

    # every flag is one the table documents, in its documented form; none is missing
    table = _value_flags(runtime)
    for flag, value in pairs:
        assert flag in table, f"{flag} is not in the table of documented {runtime} flags"
        form = table[flag].form
        assert (value is None) == (form is None), (flag, value)
        assert value is None or form is None or re.fullmatch(form, value), (flag, value)
    assert {f for f, _ in pairs} == set(table)  # CUDA_VISIBLE_DEVICES is set here
    assert all(f.source for f in FLAGS) and runtime in SIGNALS

    # the exact command line
    mounts = _expected_mounts(rig, binds)
    if runtime == "apptainer":
        expected = ["exec", "--nv", "--cleanenv", "--no-home"]
        for m in mounts:
            expected += ["--bind", m]
        expected += ["--env", "CUDA_VISIBLE_DEVICES=0,1", IMAGES[runtime]]
        assert argv[: len(expected)] == expected
        command = rest[1:]
    else:
        assert pairs == [
            ("--ntasks", "1"),
            ("--container-image", IMAGES[runtime]),
            ("--container-mounts", ",".join(mounts)),
            ("--no-container-mount-home", None),
            ("--no-container-entrypoint", None),
        ]
        command = rest
    assert command[:2] == ["/bin/sh", "-c"] and command[3:7] == [
        "stb-triton",
        str(rig.shim),
        str(rig.key),
        "tritonserver",  # the image's own, found on its PATH
    ]

    # the key: in tritonserver's arguments only
    args, cmdline, environ = _server_lines(done)
    assert f"--http-restricted-api=model-repository:X-Stb-Key={KEY}" in args
    assert f"--grpc-restricted-protocol=model-repository:x-stb-key={KEY}" in args
    assert "X-Stb-Key=@STB_KEY@" in cmdline and KEY not in cmdline and KEY not in environ
    assert not any(KEY in a for a in argv) and "X-Stb-Key=@STB_KEY@" in " ".join(argv)
    # the runtime itself never preloads the shim (it would take the key into its argv)
    assert "LD_PRELOAD" not in runtime_env and not any(KEY in v for v in runtime_env.values())
    assert "CUDA_VISIBLE_DEVICES=0,1" in environ  # through --cleanenv, or pyxis's host env

    # and tritonserver's flags are the wheel's, runtime or not
    wheel = rig.run(rig.env("wheel"))
    assert wheel.returncode == 0, wheel.stderr
    assert _server_lines(wheel)[0] == args


@pytest.mark.parametrize("runtime", ["wheel", "apptainer", "pyxis"])
def test_a_shim_the_runtime_cannot_load_stops_the_job(rig: Rig, runtime: str) -> None:
    """ld.so skips an LD_PRELOAD it cannot load (another glibc, another architecture, a
    broken file) and the server would start with the literal placeholder as its key: the
    probe inside the runtime stops the job instead."""
    rig.shim.write_bytes(b"not an ELF object")
    done = rig.run(rig.env(runtime))
    assert done.returncode == 2, done.stderr
    assert "did not load where tritonserver runs" in done.stderr
    assert "arg " not in done.stdout  # tritonserver never ran


def test_a_runtime_missing_on_the_node_is_named(rig: Rig, tmp_path: Path) -> None:
    env = rig.env("apptainer", PATH="/usr/bin:/bin")
    done = rig.run(env)
    assert done.returncode == 2 and "apptainer is not on PATH on node n4" in done.stderr
    sif = rig.env("apptainer", STB_TRITON_IMAGE=str(tmp_path / "missing.sif"))
    done = rig.run(sif)
    assert done.returncode == 2 and "missing.sif is not readable on node n4" in done.stderr
    unknown = rig.run(rig.env("wheel", STB_TRITON_RUNTIME="docker"))
    assert unknown.returncode == 2 and "not one of wheel, apptainer, pyxis" in unknown.stderr


def test_under_pyxis_the_batch_shell_passes_sigterm_to_the_step(rig: Rig, tmp_path: Path) -> None:
    """srun would turn its own SIGTERM into SIGKILL of Triton: the batch shell keeps it
    as a child and asks Slurm to signal the job's steps instead (a fake scancel here)."""
    server = rig.home / "bin" / "tritonserver"
    pid_file = tmp_path / "server.pid"
    server.write_text(
        f"#!/bin/bash\necho $$ > {pid_file}\n"
        "trap 'kill $!; echo drained; exit 0' TERM\n"
        "sleep 30 & wait\n"
    )
    scancel = rig.bin_dir / "scancel"
    scancel.write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$*" > {tmp_path / "scancel.args"}\n'
        f'kill -TERM "$(cat {pid_file})"\n'
    )
    scancel.chmod(0o755)
    proc = subprocess.Popen(
        ["bash", str(triton_sbatch())],
        env=rig.env("pyxis"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), proc.communicate(timeout=5)
    proc.send_signal(signal.SIGTERM)  # what --signal=B:TERM@30 and scancel --batch send
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert (tmp_path / "scancel.args").read_text().strip() == "--signal=TERM 7"
    assert "drained" in out


def test_the_shim_needs_no_glibc_newer_than_2_28(tmp_path: Path) -> None:
    """The container's glibc loads the shim built on the host: its newest symbol version
    is what an image must have (2.28: RHEL 8; NGC's Triton 22.xx images are Ubuntu 20.04,
    glibc 2.31, 24.xx are 22.04 and 24.04)."""
    objdump = shutil.which("objdump")
    if objdump is None or shutil.which("cc") is None:
        pytest.skip("no objdump or C compiler")
    shim = build(key_shim_source(), tmp_path / "libstbkey.so")
    symbols = subprocess.run([objdump, "-T", str(shim)], capture_output=True, text=True).stdout
    versions = {
        tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", symbols)
    }
    assert versions and max(versions) <= (2, 28), sorted(versions)
