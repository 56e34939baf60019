"""The audit trail (`bridge.leases.audit`, `bridge.audit`): the chain's canonical form
and hash, `verify` naming the first changed, removed or reordered entry, the export
formats, `Trail`'s outcomes and what a trail that cannot be written does (an operator's
action refused, the daemon's pass reporting it), the daemon's hooks on in-memory fakes,
and `stb audit` on a SQLite file. Concurrency and PostgreSQL: tests/db/test_audit_store.py."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from bridge.audit.cli import parse_since
from bridge.audit.export import jsonl, syslog
from bridge.audit.trail import AuditError, Trail, daemon, fingerprint, operator, outcome_of
from bridge.cli import app
from bridge.config import BridgeConfig
from bridge.daemon.service import DaemonError, record_config, token_changes
from bridge.http.auth import TokenTable
from bridge.leases.audit import (
    GENESIS,
    AuditEntry,
    AuditStore,
    Record,
    canonical,
    entry_hash,
    verify,
)
from bridge.leases.requests import RequestQueue
from bridge.leases.store import create_schema, make_engine
from tests.unit.fakes import N3, Harness, address_of, at, make_harness
from tests.unit.helpers import write_tokens

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)


def _store(tmp_path: Path) -> AuditStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'bridge.db'}")
    create_schema(engine)
    return AuditStore(engine)


def _chain(store: AuditStore, n: int) -> list[AuditEntry]:
    for i in range(n):
        rec = Record("lend", f"node n{i}", "ok", "alice", f"request {i}", unix_user="alice")
        store.append(rec, T0 + timedelta(seconds=i))
    return list(store.walk())


# ---- the chain ------------------------------------------------------------------------


def test_the_canonical_form_is_sorted_compact_json_with_the_time_in_utc(tmp_path: Path) -> None:
    (entry,) = _chain(_store(tmp_path), 1)
    doc = json.loads(canonical(entry))
    assert canonical(entry) == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    assert doc["at"] == "2026-12-04T10:00:00.000000+00:00"
    assert (doc["seq"], doc["prev_hash"], doc["epoch"]) == (1, GENESIS, None)
    assert "hash" not in doc and "id" not in doc
    # the same instant in another zone is the same entry
    moved = entry.model_copy(update={"at": T0.astimezone(ZoneInfo("Asia/Tokyo"))})
    assert canonical(moved) == canonical(entry)


def test_each_entry_links_to_the_one_before_and_verify_holds(tmp_path: Path) -> None:
    entries = _chain(_store(tmp_path), 4)
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    assert entries[0].prev_hash == GENESIS
    assert all(b.prev_hash == a.hash for a, b in pairwise(entries))
    verdict = verify(entries)
    assert verdict.broken is None and (verdict.checked, verdict.head_seq) == (4, 4)
    assert verdict.head_hash == entries[-1].hash


def test_verify_names_a_changed_a_removed_and_a_reordered_entry(tmp_path: Path) -> None:
    entries = _chain(_store(tmp_path), 5)
    changed = [*entries[:2], entries[2].model_copy(update={"outcome": "refused"}), *entries[3:]]
    broken = verify(changed).broken
    assert broken is not None and broken.seq == 3 and "do not match its hash" in broken.why
    removed = [*entries[:2], *entries[3:]]
    broken = verify(removed).broken
    assert broken is not None and broken.seq == 4 and "entries 3 to 3 are missing" in broken.why
    swapped = [entries[0], entries[2], entries[1], *entries[3:]]
    broken = verify(swapped).broken
    assert broken is not None and broken.seq == 3
    # a changed entry given a fresh hash: its successor's link no longer matches
    forged = entries[1].model_copy(update={"detail": "nothing"})
    forged.hash = entry_hash(forged)
    broken = verify([entries[0], forged, *entries[2:]]).broken
    assert broken is not None and broken.seq == 3 and "is not the hash of entry 2" in broken.why


def test_a_record_refuses_an_unknown_outcome_and_a_naive_time(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="audit outcome 'maybe'"):
        Record("lend", "node n3", "maybe", "alice")
    store = _store(tmp_path)
    with pytest.raises(ValueError, match="naive datetime"):
        store.append(Record("lend", "node n3", "ok", "alice"), datetime(2026, 12, 4))
    assert list(store.walk()) == []


# ---- export and the list's options ----------------------------------------------------


def test_the_exports_carry_every_field_on_one_line(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rec = Record("pool.drain", "pool training", "refused", "ann", 'a "quoted"]\nreason')
    (entry,) = [store.append(rec, T0)]
    doc = json.loads(jsonl(entry))
    assert doc["hash"] == entry.hash and doc["at"] == "2026-12-04T10:00:00.000000+00:00"
    line = syslog(entry)
    assert "\n" not in line
    assert line.startswith("<84>1 2026-12-04T10:00:00.000000+00:00 - stb - pool.drain [stb@32473 ")
    assert 'outcome="refused"' in line and f'hash="{entry.hash}"' in line
    assert line.endswith('ann pool.drain pool training: refused (a "quoted"] reason)')


def test_since_takes_a_time_or_an_age_and_names_bad_text() -> None:
    assert parse_since("2026-12-04", T0) == datetime(2026, 12, 4, tzinfo=UTC)
    assert parse_since("90m", T0) == T0 - timedelta(minutes=90)
    assert parse_since("7d", T0) == T0 - timedelta(days=7)
    with pytest.raises(ValueError, match="--since 'yesterday': not an ISO 8601 time"):
        parse_since("yesterday", T0)


# ---- Trail ----------------------------------------------------------------------------


def test_who_is_the_user_with_the_slurm_job_or_the_daemon_on_its_host() -> None:
    me = operator({"SLURM_JOB_ID": "4711"})
    assert me.name == me.unix_user and me.slurm_job == "4711" and me.token is None
    assert operator({}).slurm_job is None
    assert daemon().name.startswith("daemon@")
    assert fingerprint("t" * 24) == fingerprint("t" * 24) and len(fingerprint("x")) == 12
    assert [outcome_of(t) for t in ("refused: held", "failed: x", "lease 1 lending n3")] == [
        "refused",
        "failed",
        "ok",
    ]


def test_audited_records_ok_refused_or_failed_once_and_reraises(tmp_path: Path) -> None:
    trail = Trail(_store(tmp_path), operator({}), clock=lambda: T0)
    with trail.audited("model.publish", "model echo") as note:
        note.detail = "version 2"
    with pytest.raises(KeyError), trail.audited("model.retire", "model echo", (KeyError,)):
        raise KeyError("no such model")
    with pytest.raises(OSError), trail.audited("model.rollback", "model echo"):
        raise OSError("disk full")
    got = [(e.action, e.outcome, e.detail) for e in trail.store.walk()]
    assert got == [
        ("model.publish", "ok", "version 2"),
        ("model.retire", "refused", "'no such model'"),
        ("model.rollback", "failed", "disk full"),
    ]
    with pytest.raises(ValueError, match="unknown audit action"):
        trail.record("lend.everything", "x", "ok")


def test_an_unreachable_trail_refuses_the_action_before_it_runs(tmp_path: Path) -> None:
    trail = Trail(_store(tmp_path), operator({}))
    with trail.store._engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_entry"))
    ran = []
    with pytest.raises(AuditError, match="cannot be read"), trail.audited("model.publish", "m"):
        ran.append(1)
    assert ran == []


def test_an_operator_request_is_not_queued_when_its_entry_cannot_be_written(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    queue = RequestQueue(store._engine)
    trail = Trail(store, operator({}))
    req = queue.request_lend("n3", [], T0, "alice", trail.within("lend.request", "node n3"))
    (entry,) = store.walk()
    assert (entry.action, entry.target, entry.detail) == (
        "lend.request",
        "node n3",
        f"request {req.id}",
    )
    with store._engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_entry"))
    with pytest.raises(OperationalError):
        queue.request_lend("n5", [], T0, "alice", trail.within("lend.request", "node n5"))
    with pytest.raises(OperationalError):
        queue.hold("training", T0, "alice", "", trail.within("pool.drain", "pool training"))
    assert [r.node for r in queue.pending()] == ["n3"] and queue.holds() == {}


# ---- the daemon's hooks ---------------------------------------------------------------


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def _trail_of(h: Harness) -> list[tuple[str, str, str, str]]:
    return [(e.action, e.target, e.outcome, e.actor) for e in h.reconciler.audit.store.walk()]


def test_the_daemon_records_each_operator_request_it_carries_out_once(h: Harness) -> None:
    h.triton.server(address_of(N3), models={"busy": "READY"})
    lend = h.requests.request_lend("n3", ["busy"], at(0), "alice")
    h.tick(0)
    h.tick(1)
    h.tick(2)
    h.tick(3)
    assert h.lease(1).state.value == "serving"
    ret = h.requests.request_return(1, at(4), "bob")
    gone = h.requests.request_return(99, at(4), "bob")
    h.tick(4)
    h.tick(5)
    me = h.reconciler.audit.actor.name
    assert _trail_of(h) == [
        ("lend", "node n3", "ok", me),
        ("request.done", f"request {lend.id}", "ok", me),
        ("return", "lease 1", "ok", me),
        ("request.done", f"request {ret.id}", "ok", me),
        ("request.done", f"request {gone.id}", "refused", me),
    ]
    details = [e.detail for e in h.reconciler.audit.store.walk()]
    assert details[0] == f"lease 1: operator request {lend.id} by alice"
    assert details[1] == f"request {lend.id}: lend node n3: lease 1 lending n3"
    assert details[2] == f"lease 1 serving -> draining: operator request {ret.id} by bob"
    assert details[3] == f"request {ret.id}: return lease 1: lease 1 returning"
    assert details[4].startswith(f"request {gone.id}: return lease 99: refused: ")
    assert h.reconciler.audit.store.verify().broken is None


def test_a_lend_is_recorded_once_though_its_request_is_taken_again(h: Harness) -> None:
    """A daemon that died after lending but before finishing the request: the next one
    answers it from the lease (`replayed_lend`), and the lend is in the trail once."""
    lend = h.requests.request_lend("n3", ["busy"], at(0), "alice")
    finish = h.requests.finish
    h.requests.finish = lambda *a, **k: None  # type: ignore[method-assign]
    h.tick(0)
    h.requests.finish = finish  # type: ignore[method-assign]
    h.tick(1)
    actions = [(e.action, e.target) for e in h.reconciler.audit.store.walk()]
    assert actions == [("lend", "node n3"), ("request.done", f"request {lend.id}")]


def test_a_lend_whose_entry_cannot_be_written_is_not_made(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: object) -> None:
        raise OperationalError("INSERT INTO audit_entry", {}, Exception("disk I/O error"))

    monkeypatch.setattr(h.reconciler.audit.store, "append_in", down)
    h.requests.request_lend("n3", ["busy"], at(0), "alice")
    r = h.tick(0)
    assert r.errors and "disk I/O error" in r.errors[-1].message
    assert h.reconciler.store.open_leases() == []  # nothing lent unrecorded
    assert h.slurm.writes == []  # nothing asked of Slurm


# ---- stb audit ------------------------------------------------------------------------


def test_stb_audit_lists_filters_and_verify_names_the_changed_entry(tmp_path: Path) -> None:
    store = _store(tmp_path)
    conf = tmp_path / "bridge.toml"
    conf.write_text(f'database_url = "sqlite:///{tmp_path / "bridge.db"}"\n')
    store.append(Record("pool.drain", "pool training", "ok", "alice"), T0)
    store.append(replace(Record("lend", "node n3", "ok", "daemon@h")), T0 + timedelta(hours=1))
    store.append(Record("token.issue", "token ci", "ok", "bob"), T0 + timedelta(hours=2))
    run = CliRunner().invoke
    got = run(app, ["audit", "--who", "alice", "--json", "--config", str(conf)])
    assert got.exit_code == 0, got.output
    assert [e["action"] for e in json.loads(got.output)] == ["pool.drain"]
    got = run(app, ["audit", "--action", "token", "--json", "--config", str(conf)])
    assert [e["target"] for e in json.loads(got.output)] == ["token ci"]
    got = run(app, ["audit", "--since", "nonsense", "--config", str(conf)])
    assert got.exit_code == 1 and "--since 'nonsense'" in got.output
    got = run(app, ["audit", "export", "--format", "syslog", "--after", "1", "--config", str(conf)])
    assert got.exit_code == 0 and len(got.output.splitlines()) == 2
    got = run(app, ["audit", "export", "--format", "xml", "--config", str(conf)])
    assert got.exit_code == 1 and "--format 'xml': one of jsonl, syslog" in got.output
    got = run(app, ["audit", "verify", "--config", str(conf)])
    assert got.exit_code == 0 and "holds: 3 entries, head 3" in got.output
    with store._engine.begin() as conn:
        conn.execute(text("UPDATE audit_entry SET actor = 'mallory' WHERE seq = 2"))
    got = run(app, ["audit", "verify", "--config", str(conf)])
    assert got.exit_code == 1
    assert "broken at entry 2 (row id 2): its fields do not match its hash" in got.output
    assert "it holds up to entry 1" in got.output


# ---- the daemon's own facts: its configuration, the tokens file ---------------------


def test_the_daemon_records_its_configuration_and_whether_it_changed(tmp_path: Path) -> None:
    trail = Trail(_store(tmp_path), daemon())
    first = BridgeConfig(tick_s=5)
    record_config(trail, first)
    record_config(trail, first)
    record_config(trail, BridgeConfig(tick_s=2))
    details = [e.detail.split(": ", 1)[1] for e in trail.store.walk()]
    assert details == ["first load recorded", "unchanged since entry 1", "changed since entry 2"]
    with trail.store._engine.begin() as conn:
        conn.execute(text("DROP TABLE audit_entry"))
    with pytest.raises(DaemonError, match="the audit trail cannot be written"):
        record_config(trail, first)  # the daemon does not start unrecorded


def test_a_token_gone_from_the_file_is_revoked_and_one_added_by_hand_issued_once(
    tmp_path: Path,
) -> None:
    trail = Trail(_store(tmp_path), daemon())
    path = write_tokens(tmp_path / "tokens", {"olga": ("operator", "o" * 24)})
    tokens = TokenTable(path, token_changes(trail))
    # `stb token` issued ci's token and recorded it; the daemon does not record it again
    ci = "c" * 24
    Trail(trail.store, operator({})).record(
        "token.issue", "token ci", "ok", f"roles metrics, fingerprint {fingerprint(ci)}"
    )
    write_tokens(path, {"ci": ("metrics", ci), "hand": ("finance", "h" * 24)})
    assert {p.name for _, p in tokens.entries()} == {"ci", "hand"}
    tokens.entries()  # unchanged: nothing more
    got = [(e.action, e.target, e.actor == trail.actor.name) for e in trail.store.walk()]
    assert got == [
        ("token.issue", "token ci", False),
        ("token.issue", "token hand", True),
        ("token.revoke", "token olga", True),
    ]
    assert all("o" * 24 not in e.detail for e in trail.store.walk())
