"""The node-local weight cache's mechanics (bridge.weights) on real files and a real
HTTP origin on 127.0.0.1: manifests, verification refusing corrupt and partial copies,
staging from a folder and from an origin (throttled, verified, renamed into place, no
half copy left), eviction, the Triton job's overlay, and the staging job's Slurm spec."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from bridge.config import ConfigError, WeightsConfig, load_config
from bridge.slurm.model import STAGING_TAG
from bridge.slurm.rest import submission
from bridge.slurm.staging import staging_job
from bridge.weights import manifest as mf
from bridge.weights import overlay
from bridge.weights.stage import CorruptSource, StageError, Throttle, copies, evict, main, stage

MB = 1 << 20


def _version(repo: Path, model: str, version: int, weights: bytes) -> Path:
    folder = repo / model / str(version)
    folder.mkdir(parents=True)
    (repo / model / "config.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n')
    (folder / "model.py").write_text("# the model\n")
    (folder / "data").mkdir()
    (folder / "data" / "weights.bin").write_bytes(weights)
    mf.write_manifest(folder, model, version)
    return folder


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    repo = tmp_path / "shared"
    _version(repo, "weighty", 1, os.urandom(4 * MB))
    _version(repo, "smol", 3, b"small weights")
    return repo


@pytest.fixture
def origin(shared: Path) -> Iterator[str]:
    """The shared repository served over HTTP on 127.0.0.1 (a real server)."""
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(shared))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined, assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_manifest_lists_every_file_with_its_digest(shared: Path) -> None:
    m = mf.read(shared / "weighty" / "1")
    assert [f.path for f in m.files] == ["data/weights.bin", "model.py"]
    assert m.total_bytes == 4 * MB + len("# the model\n")
    assert m.digest == mf.list_digest(m.files) and m.staged_at is None
    assert mf.verify(shared / "weighty" / "1", "weighty", 1).ok


def test_verify_refuses_a_corrupt_a_partial_and_an_edited_copy(shared: Path) -> None:
    folder = shared / "weighty" / "1"
    assert "version 1, not 2" in mf.verify(folder, "weighty", 2).reason
    blob = folder / "data" / "weights.bin"
    data = bytearray(blob.read_bytes())
    data[MB] ^= 0xFF  # one flipped byte, same size
    blob.write_bytes(bytes(data))
    v = mf.verify(folder)
    assert not v.ok and "weights.bin: sha256" in v.reason and "the manifest says" in v.reason
    blob.write_bytes(bytes(data[: 2 * MB]))
    v = mf.verify(folder)
    assert not v.ok and f"{2 * MB} bytes, the manifest says {4 * MB}" in v.reason
    blob.unlink()
    assert "missing (listed in the manifest)" in mf.verify(folder).reason
    text = json.loads((folder / mf.MANIFEST).read_text())
    text["files"][0]["size"] = 1
    (folder / mf.MANIFEST).write_text(json.dumps(text))
    assert "its digest is not that of its file list" in mf.verify(folder).reason
    (folder / mf.MANIFEST).unlink()
    assert "stb-weights.json" in mf.verify(folder).reason and not mf.verify(folder).ok


def test_stage_from_a_folder_verifies_and_renames_into_place_once(
    shared: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    seen: list[tuple[int, int]] = []
    s = stage(str(shared), cache, "weighty", 1, progress=lambda d, t: seen.append((d, t)))
    assert (
        s.copied
        and s.path == cache / "weighty" / "1"
        and s.total_bytes == seen[-1][0] == seen[-1][1]
    )
    m = mf.read(s.path)
    assert m.source == str(shared) and m.staged_at is not None
    assert m.digest == mf.read(shared / "weighty" / "1").digest
    assert mf.verify(s.path, "weighty", 1).ok
    assert [p.name for p in (cache / "weighty").iterdir() if p.is_dir()] == ["1"]
    assert not stage(str(shared), cache, "weighty", 1).copied  # intact: nothing copied
    (s.path / "data" / "weights.bin").write_bytes(b"torn")
    again = stage(str(shared), cache, "weighty", 1)  # corrupt: replaced
    assert again.copied and mf.verify(again.path).ok
    assert [(c.model, c.version) for c in copies(cache)] == [("weighty", 1)]


def test_stage_from_an_origin_is_throttled_to_the_bandwidth(origin: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    t0 = time.monotonic()
    s = stage(origin, cache, "weighty", 1, bandwidth_bytes_s=8 * MB)
    took = time.monotonic() - t0
    assert 0.45 <= took < 3.0, took  # 4 MB at 8 MB/s
    assert mf.verify(s.path, "weighty", 1).ok and mf.read(s.path).source == origin
    fast = stage(origin, tmp_path / "other", "weighty", 1)
    assert fast.seconds < took


def test_a_corrupt_source_or_a_crash_leaves_no_copy_that_looks_complete(
    shared: Path, tmp_path: Path, origin: str
) -> None:
    cache = tmp_path / "cache"
    blob = shared / "weighty" / "1" / "data" / "weights.bin"
    good = blob.read_bytes()
    blob.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(CorruptSource, match="sha256 differs"):
        stage(origin, cache, "weighty", 1)
    assert list((cache / "weighty").iterdir()) == [cache / "weighty" / ".1.lock"]
    blob.write_bytes(good)

    class Crash(Exception):
        pass

    class Dies(Throttle):
        def took(self, n: int) -> None:
            raise Crash("the node went down mid-copy")

    with pytest.raises(Crash):
        stage(str(shared), cache, "weighty", 1, throttle=Dies(0))
    assert not (cache / "weighty" / "1").exists() and copies(cache) == []
    # a hard crash (no cleanup) leaves a hidden partial: ignored, and removed by the next
    stale = cache / "weighty" / ".partial-1-dead"
    (stale / "data").mkdir(parents=True)
    (stale / "data" / "weights.bin").write_bytes(good[:100])
    assert copies(cache) == []
    stage(str(shared), cache, "weighty", 1)
    assert not stale.exists() and [c.version for c in copies(cache)] == [1]


def test_budget_evict_and_the_cli(
    shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    stage(str(shared), cache, "weighty", 1)
    with pytest.raises(StageError, match=r"the cache holds \d+ of its budget \d+: evict first"):
        stage(str(shared), cache, "smol", 3, budget_bytes=4 * MB + 20)
    assert evict(cache, "weighty", 1) == mf.read(shared / "weighty" / "1").total_bytes
    assert evict(cache, "weighty", 1) == 0 and copies(cache) == []
    argv = [
        "--source",
        str(shared),
        "--cache-root",
        str(cache),
        "--model",
        "smol",
        "--version",
        "3",
    ]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "stb-weights: staged model=smol version=3 bytes=" in out.out and "copied=yes" in out.out
    assert "stage: smol 3:" in out.err
    assert main([*argv[:-1], "9"]) == 2
    assert "no such version folder" in capsys.readouterr().err
    # the daemon's plan makes room through the job: --evict goes first
    assert main([*argv[:-1], "3", "--evict", "smol/3"]) == 0
    out = capsys.readouterr().out
    assert out.index("stb-weights: evicted model=smol version=3 bytes=") < out.index(
        "stb-weights: staged model=smol"
    )
    assert "copied=yes" in out  # evicted, so copied again
    assert main([*argv, "--evict", "smol/x"]) == 2
    assert "evicting 'smol/x'" in capsys.readouterr().err


def test_a_stamped_copy_is_taken_unread_until_any_of_its_files_changes(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    copy = stage(str(shared), cache, "weighty", 1).path
    assert (copy / mf.STAMP).is_file()  # the staging job's full check left it
    assert mf.STAMP not in {f.path for f in mf.read(copy).files}
    hashed: list[Path] = []
    real = mf.file_sha256
    monkeypatch.setattr(mf, "file_sha256", lambda p, *a: hashed.append(p) or real(p, *a))
    v = mf.verify(copy, "weighty", 1, stamp=True)
    assert v.ok and "unchanged since verified at" in v.reason and hashed == []
    assert mf.verify(copy, "weighty", 1).ok and len(hashed) == 2  # without: every file read
    hashed.clear()

    # one byte changed in place, its mtime set back: the ctime still says it was written
    blob = copy / "data" / "weights.bin"
    before = blob.stat()
    time.sleep(0.01)
    with open(blob, "r+b") as f:
        f.seek(7)
        b = f.read(1)
        f.seek(7)
        f.write(bytes([b[0] ^ 1]))
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    v = mf.verify(copy, "weighty", 1, stamp=True)
    assert not v.ok and "sha256" in v.reason and hashed  # read in full, refused

    # the overlay: stamp by default, --verify full reads every byte
    fresh = stage(str(shared), cache, "weighty", 1)  # replaced, stamped again
    assert fresh.copied
    hashed.clear()
    out = tmp_path / "job"
    (choice,) = overlay.prepare(shared, cache, out, ["weighty"], stamp=True)[:1]
    assert choice.source == "local" and hashed == []
    assert overlay.main(["--shared", str(shared), "--cache-root", str(cache), "--out",
                         str(out), "--models", "weighty", "--verify", "full"]) == 0  # fmt: skip
    assert len(hashed) == 2
    # a stamp of another digest (a torn or forged one) is no stamp: read in full
    data = json.loads((fresh.path / mf.STAMP).read_text())
    (fresh.path / mf.STAMP).write_text(json.dumps(data | {"digest": "0" * 64}))
    hashed.clear()
    assert mf.verify(fresh.path, "weighty", 1, stamp=True).ok and len(hashed) == 2


def test_the_overlay_points_verified_copies_local_and_the_rest_shared(
    shared: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    stage(str(shared), cache, "weighty", 1)
    stage(str(shared), cache, "smol", 3)
    (cache / "smol" / "3" / "data" / "weights.bin").write_bytes(b"small weightz")  # same size
    _version(shared, "echo", 1, b"e")  # not cached at all
    out = tmp_path / "job" / "42"
    choices = {c.model: c for c in overlay.prepare(shared, cache, out)}
    assert (choices["weighty"].source, choices["weighty"].reason) == ("local", "verified")
    assert (out / "weighty" / "1").resolve() == (cache / "weighty" / "1").resolve()
    assert (out / "weighty" / "config.pbtxt").resolve() == (
        shared / "weighty" / "config.pbtxt"
    ).resolve()
    assert choices["smol"].source == "shared" and "sha256" in choices["smol"].reason
    assert (out / "smol").resolve() == (shared / "smol").resolve()
    assert choices["echo"].source == "shared" and choices["echo"].reason == "no local copy"
    log = "\n".join(c.line() for c in choices.values())
    assert overlay.sources(log) == {
        "weighty": (1, "local"),
        "smol": (3, "shared"),
        "echo": (1, "shared"),
    }
    assert (
        overlay.main(
            [
                "--shared",
                str(shared),
                "--cache-root",
                str(cache),
                "--out",
                str(out),
                "--models",
                "weighty;echo",
            ]
        )
        == 0
    )
    assert (out / "smol").resolve() == (shared / "smol").resolve()


def test_throttle_paces_on_an_injected_clock() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    t = Throttle(100, clock=lambda: now[0], sleep=sleep)
    t.took(50)
    t.took(50)
    assert slept == [0.5, 0.5] and now[0] == 1.0
    with pytest.raises(ValueError, match="bandwidth must be >= 0"):
        Throttle(-1)


def test_the_staging_job_is_tagged_low_priority_and_on_its_node(tmp_path: Path) -> None:
    cfg = WeightsConfig(cache_root=Path("/local/stb-weights"), qos="scavenger")
    spec = staging_job(
        cfg,
        node="n3",
        model="weighty",
        version=2,
        source="http://127.0.0.1:8090",
        account="bridge",
        partition="elastic",
        python="/opt/py/bin/python",
    )
    assert (spec.name, spec.comment, spec.nodelist) == (
        "stb-staging-weighty-2",
        STAGING_TAG,
        ("n3",),
    )
    assert (spec.partition, spec.account, spec.qos, spec.nice) == (
        "elastic",
        "bridge",
        "scavenger",
        10000,
    )
    assert spec.gpus_per_node is None and spec.requeue is True
    assert spec.env["STB_WEIGHTS_BANDWIDTH"] == "200000000"
    body = submission(spec, "#!/bin/bash\n#SBATCH --job-name=stb-staging\n", {}, "/")
    assert (body["job"]["qos"], body["job"]["nice"], body["job"]["name"]) == (
        "scavenger",
        10000,
        "stb-staging-weighty-2",
    )
    with pytest.raises(ValueError, match=r"weights\.cache_root is not set"):
        staging_job(WeightsConfig(), node="n3", model="m", version=1, source="/s", account="b")


def test_bad_weights_settings_name_their_key(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text('[weights]\nbandwidth_bytes_s = -5\nqos = "a b"\nmax_jobs = 0\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    for key in ("weights.bandwidth_bytes_s", "weights.qos", "weights.max_jobs"):
        assert key in text


def test_stb_weights_stage_job_submits_and_opens_the_catalogue_row(
    shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from bridge.cli import app
    from bridge.leases.store import create_schema, make_engine
    from bridge.leases.weights import WeightStore
    from tests.unit.fakes import N3, FakeSlurm

    slurm = FakeSlurm([N3])
    monkeypatch.setattr("bridge.weights_cli.open_backend", lambda: slurm)
    key = tmp_path / "triton.key"
    key.write_text("k\n")
    db = f"sqlite:///{tmp_path / 'bridge.db'}"
    toml = tmp_path / "bridge.toml"
    toml.write_text(
        f'database_url = "{db}"\n[triton]\nkey_file = "{key}"\nmodel_repository = "{shared}"\n'
        f'[weights]\ncache_root = "{tmp_path / "cache"}"\npartition = "elastic"\n'
    )
    out = CliRunner().invoke(
        app, ["weights", "stage", "weighty", "1", "--job", "n3", "-c", str(toml)]
    )
    assert out.exit_code == 0, out.output
    (spec,) = slurm.specs
    assert spec.comment == STAGING_TAG and spec.nodelist == ("n3",)
    engine = make_engine(db)
    create_schema(engine)
    (row,) = WeightStore(engine).copies()
    assert (row.node, row.model, row.version, row.state) == ("n3", "weighty", 1, "staging")
    assert row.job_id == "100" and row.path.endswith("weighty/1")


def test_stb_weights_verify_renews_the_stamp_or_removes_it(shared: Path, tmp_path: Path) -> None:
    """A full check by hand: an intact copy's stamp is renewed; a copy refused (a change the
    stamp could not see, here its stamp rewritten after the bytes changed) loses it, so the
    next start reads it in full and refuses it too."""
    from typer.testing import CliRunner

    from bridge.cli import app

    cache = tmp_path / "cache"
    copy = stage(str(shared), cache, "weighty", 1).path
    toml = tmp_path / "bridge.toml"
    toml.write_text(f'[weights]\ncache_root = "{cache}"\n')
    argv = ["weights", "verify", "weighty", "1", "-c", str(toml)]
    (copy / mf.STAMP).unlink()
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 0 and "intact" in out.output, out.output
    assert mf.verify(copy, "weighty", 1, stamp=True).stamped_at is not None  # renewed
    blob = copy / "data" / "weights.bin"
    blob.write_bytes(bytes(blob.stat().st_size))  # same size, other bytes
    mf.write_stamp(copy, mf.read(copy))  # as if the change had been below the file system
    assert mf.verify(copy, "weighty", 1, stamp=True).ok  # the stamp alone cannot tell
    out = CliRunner().invoke(app, argv)
    assert out.exit_code == 1 and "refused" in out.output and "sha256" in out.output
    assert not (copy / mf.STAMP).exists()
    assert not mf.verify(copy, "weighty", 1, stamp=True).ok
