"""The Slurm release matrix: the contract suite, the lab's lend/return and ledger tests and
the parser unit tests on each Debian suite's Slurm (bookworm 22.05, trixie 24.11, forky
26.05), each in its own Debian root and its own network namespace; one command.

For each suite, one at a time:

1. the root: `debootstrap --variant=minbase <suite> .matrix/<suite> <mirror>` once (forky
   with debootstrap's `sid` script); apt in the root ignores Release files past their
   Valid-Until (a mirror snapshot), and services are never started by package scripts
   (`policy-rc.d`);
2. the checkout: the files git tracks or would track (`git ls-files -co --exclude-standard`)
   copied to `<root>/srv/stb` (files gone from the checkout are removed there), so the
   run sees this working tree, never the host's `.lab`, `.venv` or `.matrix`;
3. provisioning (host network, in the root): the Debian packages `stb lab up` would install
   (`bridge.lab.system`: Slurm, munge, nginx, Prometheus, gcc, MariaDB) and a venv at
   `/opt/stb-venv` with the project (`pip install -e '/srv/stb[dev]'`), once per package list
   and pyproject.toml;
4. the run: `ip netns add stb-<suite>` (loopback only, with a link-local address on lo
   besides 127.0.0.1 because Slurm's getaddrinfo asks for AI_ADDRCONFIG; the root's
   lab has 127.0.0.1 and 127.0.1.x to itself, and nothing answers on 3306, so the lab
   starts its own MariaDB),
   then in a private mount namespace /proc, /sys, /dev mounted into the root and
   `chroot <root> /opt/stb-venv/bin/python /srv/stb/bench/slurm_matrix_inside.py`: `stb lab
   up`, pytest on the tests (JUnit XML), with `--record` the sacct/squeue JSON of a small
   scenario, `stb lab down`;
5. cleanup, in a `finally`: every process left in the namespace is ended by its pid (the
   lab's daemons, if `down` did not stop them), the namespace deleted; the mounts live in
   the run's own mount namespace and go with its last process.

The host's lab (`.lab`, its ports, its MariaDB) is never touched. Prints a table (release x
test file: passed/failed/skipped) of this run, then of every suite's last run (kept in
`.matrix/results.json`, written to `.matrix/results.md` with each suite's date), and ends
with `RESULT key=value ...` of this run. With `--record`, the recorded JSON (paths
already /srv/stb, the host name scrubbed) is copied to
tests/data/slurm/{sacct,squeue}-matrix-<rel>.json.

Usage (as root, 2 cores: one suite at a time, about 4 minutes each once built, 3 more to
build one):
    .venv/bin/python bench/slurm_matrix.py [--suites bookworm,trixie,forky]
        [--tests tests/lab/test_slurm_adapter.py,...] [--record] [--mirror URL]
        [--timeout-s 3600]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.lab.system import PACKAGES, PLUGINS  # noqa: E402

MATRIX = ROOT / ".matrix"
#: where the checkout is inside each root (the recorded test data's paths say /srv/stb)
SRV = "/srv/stb"
VENV = "/opt/stb-venv"
#: where the inside runner leaves its results, inside the root
OUT = "/var/tmp/stb-matrix"
#: the nvidia-pytriton each root's venv gets (see `provision`)
PYTRITON = "nvidia-pytriton==0.7.0"
DEFAULT_TESTS = (
    "tests/lab/test_slurm_adapter.py",
    "tests/lab/test_bridge_e2e.py",
    "tests/lab/test_ledger_lab.py",
    "tests/unit/test_slurm_parse.py",
    "tests/unit/test_sacct_fast_reader.py",
    "tests/unit/test_slurm_releases.py",
)


@dataclass(frozen=True)
class Suite:
    name: str
    #: debootstrap's script for the suite, when it has none of its own name
    script: str | None
    #: the Python the root's venv uses: the newest the suite has for which nvidia-pytriton
    #: ships a Python-backend stub (3.8 to 3.13 in pytriton 0.7)
    python: str


SUITES = {
    "bookworm": Suite("bookworm", None, "3.11"),
    "trixie": Suite("trixie", None, "3.13"),
    "forky": Suite("forky", "sid", "3.13"),
    "sid": Suite("sid", "sid", "3.13"),
}


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, check=True, **kw)  # type: ignore[call-overload,no-any-return]


def default_mirror() -> str:
    """The Debian mirror this machine's apt uses (a deb822 `URIs:` or a one-line `deb`
    entry ending in /debian), else deb.debian.org."""
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in paths:
        if path.is_file() and path.suffix in ("", ".list", ".sources"):
            m = re.search(
                r"(?m)^(?:URIs:|deb)\s.*?(https?://\S+/debian)/?(?:\s|$)", path.read_text()
            )
            if m:
                return m.group(1)
    return "http://deb.debian.org/debian"


# --- the root -------------------------------------------------------------------------


def ensure_root(suite: Suite, mirror: str) -> Path:
    root = MATRIX / suite.name
    done = root / ".stb-debootstrap-done"
    if not done.exists():
        if root.exists():
            shutil.rmtree(root)
        if not shutil.which("debootstrap"):
            raise SystemExit("debootstrap is not installed: apt-get install -y debootstrap")
        log(f"{suite.name}: debootstrap into {root.relative_to(ROOT)} from {mirror}")
        argv = [
            "debootstrap",
            "--variant=minbase",
            "--include=ca-certificates,python3,procps,iproute2",
            suite.name,
            str(root),
            mirror,
        ]
        if suite.script:
            argv.append(f"/usr/share/debootstrap/scripts/{suite.script}")
        with open(MATRIX / f"debootstrap-{suite.name}.log", "w") as out:
            run(argv, stdout=out, stderr=subprocess.STDOUT)
        done.touch()
    # a mirror snapshot's Release files may be past their Valid-Until
    (root / "etc/apt/apt.conf.d/99stb-matrix").write_text(
        'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n'
    )
    policy = root / "usr/sbin/policy-rc.d"  # package scripts start no service
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    # debootstrap writes no /etc/hosts; bookworm's mariadb-install-db refuses to run when
    # neither the host name nor localhost resolves
    hosts = root / "etc/hosts"
    if not hosts.exists() or "localhost" not in hosts.read_text():
        hosts.write_text(f"127.0.0.1\tlocalhost {socket.gethostname()}\n::1\tlocalhost\n")
    return root


def sync_checkout(root: Path) -> int:
    """Copy the checkout's files into <root>/srv/stb; remove those it no longer has."""
    listed = run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True
    ).stdout
    files = sorted({f for f in listed.split("\0") if f and (ROOT / f).is_file()})
    dest = root / SRV.lstrip("/")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = root / "srv/.stb-manifest"
    old = set(manifest.read_text().split("\0")) if manifest.exists() else set()
    for gone in old - set(files):
        (dest / gone).unlink(missing_ok=True)
    run(
        ["rsync", "-a", "--from0", "--files-from=-", f"{ROOT}/", f"{dest}/"], input="\0".join(files)
    )
    manifest.write_text("\0".join(files))
    return len(files)


def packages(suite: Suite) -> list[str]:
    """What `stb lab up` would install, plus the venv's Python and MariaDB."""
    py = suite.python
    return sorted(
        {
            *PACKAGES.values(),
            *PLUGINS.values(),
            "mariadb-server",
            "libc6-dev",
            f"python{py}",
            f"python{py}-venv",
            f"libpython{py}",
        }
    )


def chroot_argv(root: Path, argv: list[str]) -> list[str]:
    """argv run in the root, in a private mount namespace with /proc, /sys, the host's
    cgroup tree (Slurm 22.05's cgroup plugin needs /sys/fs/cgroup) and /dev."""
    mount = (
        'r="$1"; shift; mount -t proc proc "$r/proc" && mount -t sysfs sysfs "$r/sys" '
        '&& mount --rbind /sys/fs/cgroup "$r/sys/fs/cgroup" '
        '&& mount --rbind /dev "$r/dev" && exec chroot "$r" /usr/bin/env -i '
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "
        'LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--fork",
        "--",
        "sh",
        "-c",
        mount,
        "sh",
        str(root),
        *argv,
    ]


def provision(root: Path, suite: Suite) -> None:
    pkgs = packages(suite)
    stamp_text = json.dumps(
        {
            "packages": pkgs,
            "pyproject": (ROOT / "pyproject.toml").read_text(),
            "py": suite.python,
            "pytriton": PYTRITON,
            "libpython": "debian",
        }
    )
    stamp = hashlib.sha256(stamp_text.encode()).hexdigest()
    stamp_file = root / "srv/.stb-provisioned"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    log(f"{suite.name}: installing {len(pkgs)} Debian packages and the project's venv")
    # pip in the root trusts what the host trusts (a site's proxy CA included)
    host_ca = Path(
        os.environ.get("PIP_CERT")
        or os.environ.get("SSL_CERT_FILE")
        or "/etc/ssl/certs/ca-certificates.crt"
    )
    cert = ""
    if host_ca.is_file():
        shutil.copy(host_ca, root / "etc/ssl/certs/stb-host-ca.pem")
        cert = "PIP_CERT=/etc/ssl/certs/stb-host-ca.pem "
    script = (
        "set -e; apt-get update -qq; "
        f"apt-get install -y -qq {' '.join(pkgs)} >/dev/null; "
        f"[ -x {VENV}/bin/python ] || python{suite.python} -m venv {VENV}; "
        f"{cert}{VENV}/bin/python -m pip install -q --upgrade pip; "
        f"{cert}{VENV}/bin/python -m pip install -q -e '{SRV}[dev]'; "
        # nvidia-pytriton 0.7 (the first with a Python 3.13 backend stub) wants numpy<2,
        # which has no Python 3.13 build: pip falls back to 0.5.7 (no 3.13 stub). The lab
        # uses only its tritonserver binary and stubs, so 0.7 goes in without its deps.
        f"{cert}{VENV}/bin/python -m pip install -q --no-deps '{PYTRITON}'; "
        # Its Python 3.13 backend stub carries a libpython of its own, built without the
        # _datetime module that Debian's Python has built in: numpy (the models' import)
        # then fails in the stub ("PyCapsule_Import could not import module datetime").
        # The stub takes the suite's own libpython in its place (the same 3.13 ABI).
        f"for lib in {VENV}/lib/python{suite.python}/site-packages/nvidia_pytriton.libs/"
        f'libpython3-*.{suite.python.split(".")[1]}.so.1.0; do [ -e "$lib" ] && '
        f'ln -sf /usr/lib/x86_64-linux-gnu/libpython{suite.python}.so.1.0 "$lib"; done; true'
    )
    with open(MATRIX / f"provision-{suite.name}.log", "w") as out:
        run(chroot_argv(root, ["sh", "-c", script]), stdout=out, stderr=subprocess.STDOUT)
    stamp_file.write_text(stamp)


# --- the run --------------------------------------------------------------------------


def _end(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.2)


def _netns_pids(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _root_pids(root: Path) -> list[int]:
    """Processes whose root directory is this Debian root (started here, in a chroot)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "root") == str(root):
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def run_suite(
    root: Path, suite: Suite, tests: list[str], record: bool, timeout_s: float
) -> dict[str, object]:
    netns = f"stb-{suite.name}"
    out_dir = root / OUT.lstrip("/")
    shutil.rmtree(out_dir, ignore_errors=True)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    run(["ip", "netns", "add", netns])
    t0 = time.monotonic()
    try:
        run(["ip", "-n", netns, "link", "set", "lo", "up"])
        # Slurm resolves its listening address with AI_ADDRCONFIG, which needs an IPv4
        # address besides 127.0.0.1: a link-local one, on lo (nothing leaves the namespace)
        run(["ip", "-n", netns, "addr", "add", "169.254.77.1/32", "dev", "lo"])
        inside = [
            f"{VENV}/bin/python",
            f"{SRV}/bench/slurm_matrix_inside.py",
            "--out",
            OUT,
            "--tests",
            ",".join(tests),
        ] + (["--record"] if record else [])
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys for the namespace,
        # which has no cgroup tree to bind into the root
        argv = ["nsenter", f"--net=/run/netns/{netns}", *chroot_argv(root, inside)]
        log(f"{suite.name}: {len(tests)} test files in {netns}, log .matrix/{suite.name}.log")
        with open(MATRIX / f"{suite.name}.log", "w") as logf:
            try:
                rc = subprocess.run(
                    argv, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
    finally:
        left = sorted(set(_netns_pids(netns)) | set(_root_pids(root)))
        if left:
            log(f"{suite.name}: ending {len(left)} leftover process(es): {left}")
            _end(left)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    summary_file = out_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    return {
        "suite": suite.name,
        "rc": rc,
        "wall_s": round(time.monotonic() - t0),
        "slurm": summary.get("slurm", "?"),
        "python": summary.get("python", "?"),
        "files": junit_counts(out_dir / "junit.xml", tests),
        "recorded": summary.get("recorded", []),
        "error": summary.get("error", "" if summary else f"no summary (exit {rc})"),
    }


def junit_counts(path: Path, tests: list[str]) -> dict[str, dict[str, int]]:
    """passed/failed/skipped per test file from pytest's JUnit XML (errors count as failed)."""
    counts = {t: {"passed": 0, "failed": 0, "skipped": 0} for t in tests}
    if not path.exists():
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").split(".")
        file = next(
            (t for t in tests if t.removesuffix(".py").replace("/", ".") in ".".join(module)),
            None,
        )
        if file is None:
            continue
        kinds = {child.tag for child in case}
        kind = (
            "failed"
            if kinds & {"failure", "error"}
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        counts[file][kind] += 1
    return counts


def copy_recorded(root: Path, result: dict[str, object]) -> list[str]:
    dest = ROOT / "tests" / "data" / "slurm"
    copied = []
    for name in result["recorded"]:  # type: ignore[attr-defined]
        shutil.copy(root / OUT.lstrip("/") / name, dest / name)
        copied.append(name)
    return copied


# --- the table ------------------------------------------------------------------------


def cell(c: dict[str, int]) -> str:
    text = f"{c['passed']} passed"
    if c["failed"]:
        text += f", {c['failed']} failed"
    if c["skipped"]:
        text += f", {c['skipped']} skipped"
    return text if sum(c.values()) else "not run"


def table(results: list[dict[str, object]], tests: list[str]) -> str:
    head = "| release | " + " | ".join(f"`{Path(t).name}`" for t in tests) + " |"
    lines = [head, "|---" * (len(tests) + 1) + "|"]
    for r in results:
        files = r["files"]
        assert isinstance(files, dict)
        name = f"{r['suite']} (Slurm {r['slurm']})"
        lines.append(f"| {name} | " + " | ".join(cell(files[t]) for t in tests) + " |")
    return "\n".join(lines)


def record_results(results: list[dict[str, object]], tests: list[str]) -> str:
    """Keep each suite's last result in .matrix/results.json (a suite not run now keeps
    its earlier one, with its date) and write the table of all of them to results.md."""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    path = MATRIX / "results.json"
    kept: dict[str, dict[str, object]] = {}
    if path.exists():
        with contextlib.suppress(ValueError, AttributeError):
            kept = dict(json.loads(path.read_text()).get("suites", {}))
    for r in results:
        kept[str(r["suite"])] = {**r, "date": when, "tests": tests}
    ordered = [kept[name] for name in SUITES if name in kept]
    path.write_text(json.dumps({"suites": {str(r["suite"]): r for r in ordered}}, indent=2))
    # a suite run on other tests shows its own files as "not run" in this table
    for r in ordered:
        files = r["files"]
        assert isinstance(files, dict)
        r["files"] = {t: files.get(t, {"passed": 0, "failed": 0, "skipped": 0}) for t in tests}
    md = table(ordered, tests)
    dates = "; ".join(f"{r['suite']} {r['date']}" for r in ordered)
    command = "`.venv/bin/python bench/slurm_matrix.py`"
    (MATRIX / "results.md").write_text(f"{md}\n\nRun with {command}: {dates}.\n")
    return md


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", default="bookworm,trixie,forky")
    ap.add_argument("--tests", default=",".join(DEFAULT_TESTS))
    ap.add_argument("--record", action="store_true", help="record sacct/squeue JSON per release")
    ap.add_argument("--mirror", default=None)
    ap.add_argument("--timeout-s", type=float, default=3600)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: debootstrap, network namespaces and chroot need it")
    suites = [SUITES[s] for s in args.suites.split(",") if s]
    tests = [t for t in args.tests.split(",") if t]
    mirror = args.mirror or default_mirror()
    MATRIX.mkdir(exist_ok=True)
    results = []
    for suite in suites:
        root = ensure_root(suite, mirror)
        n = sync_checkout(root)
        log(f"{suite.name}: {n} checkout files in {SRV}")
        provision(root, suite)
        result = run_suite(root, suite, tests, args.record, args.timeout_s)
        if args.record:
            result["copied"] = copy_recorded(root, result)
        results.append(result)
        log(
            f"{suite.name}: Slurm {result['slurm']}, exit {result['rc']}, {result['wall_s']} s"
            + (f", {result['error']}" if result["error"] else "")
        )
    md = table(results, tests)
    print(md)
    merged = record_results(results, tests)
    log(f"every suite's last result: {MATRIX.relative_to(ROOT)}/results.md")
    print(merged)
    ok = all(
        r["rc"] == 0 and not any(c["failed"] for c in r["files"].values())  # type: ignore[attr-defined]
        for r in results
    )
    fields = [f"ok={str(ok).lower()}"]
    for r in results:
        files = r["files"]
        assert isinstance(files, dict)
        total = {k: sum(c[k] for c in files.values()) for k in ("passed", "failed", "skipped")}
        fields += [
            f"{r['suite']}_slurm={r['slurm']}",
            f"{r['suite']}_passed={total['passed']}",
            f"{r['suite']}_failed={total['failed']}",
            f"{r['suite']}_skipped={total['skipped']}",
            f"{r['suite']}_s={r['wall_s']}",
        ]
    print("RESULT " + " ".join(fields))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
