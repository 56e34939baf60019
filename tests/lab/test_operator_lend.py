"""Operators lend and return through the daemon's state machine (`stb lend`, `stb return`
queue requests; the reconciler's tick carries them out), on the lab; each of these
privileged actions is in the audit trail once, with who and the outcome, and a changed
entry breaks its chain where `stb audit verify` says."""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from bridge.audit.asks import ask_lend, ask_return
from bridge.cli import app
from bridge.daemon.reconciler import Reconciler
from bridge.lab.spec import LabSpec
from bridge.leases.audit import AuditEntry, AuditStore
from bridge.leases.store import make_engine
from bridge.lifecycle import LeaseState

from .helpers import tick_until, tick_until_baseline

pytestmark = pytest.mark.lab


def test_operator_lend_and_return(
    lab: LabSpec, bridge: tuple[Reconciler, str], tmp_path: Path
) -> None:
    rec, endpoint = bridge
    assert rec.requests is not None
    queue, store = rec.requests, rec.store
    conf = tmp_path / "cli.toml"  # the operator's `stb`, on the daemon's database
    conf.write_text(
        f'database_url = "{rec.config.database_url}"\n'
        f'[triton]\nmodel_repository = "{rec.config.triton.model_repository}"\n'
    )

    def stb(*args: str, code: int = 0) -> str:
        got = CliRunner().invoke(app, [*args, "--config", str(conf)])
        assert got.exit_code == code, got.output
        return got.output

    elastic = lab.pool_nodes("elastic")[0].name
    reserved = lab.pool_nodes("infer")[0].name
    log: list[str] = []
    tick_until_baseline(rec, lab, log)
    bad = [ask_lend(queue, reserved, []), ask_lend(queue, "n99", [])]
    stb("lend", elastic, "--models", "busy", "--wait", "0")
    good = queue.pending()[-1]
    tick_until(
        rec,
        lambda: any(lease.state == LeaseState.SERVING for lease in store.open_leases()),
        120,
        log,
    )
    outcomes = {r.id: (queue.get(r.id or 0) or r).outcome for r in [*bad, good]}
    assert outcomes[bad[0].id].startswith("refused: ") and "no lendable pool" in outcomes[bad[0].id]
    assert "no node 'n99'" in outcomes[bad[1].id]
    (lease,) = store.open_leases()
    assert outcomes[good.id] == f"lease {lease.id} lending {elastic}"
    assert (lease.node, lease.models) == (elastic, ["busy"])
    # The lent replica is in routing: nginx sends busy requests to both replicas.
    seen = set()
    for _ in range(20):
        r = httpx.post(
            f"http://{endpoint}/v2/models/busy/infer",
            json={
                "inputs": [
                    {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                ]
            },
        )
        assert r.status_code == 200
        seen.add(r.headers.get("X-Stb-Upstream"))
    assert len(seen) == 2, seen
    assert lease.id is not None
    stb("return", str(lease.id), "--wait", "0")
    tick_until(rec, lambda: not store.open_leases(), 120, log)
    states = [e.to_state.value for e in store.history(lease.id)]
    assert states[-4:] == ["serving", "draining", "releasing", "returned"]
    again = ask_return(queue, lease.id)
    rec.run_once(datetime.now(UTC))
    assert "already returned" in (queue.get(again.id or 0) or again).outcome
    stb("drain", "training", "--reason", "audit")
    stb("resume", "training")

    # The audit trail: each action above once, with who did it and the outcome.
    trail = AuditStore(make_engine(rec.config.database_url))
    entries = list(trail.walk())

    def once(action: str, target: str) -> AuditEntry:
        found = [e for e in entries if (e.action, e.target) == (action, target)]
        assert len(found) == 1, (action, target, entries)
        return found[0]

    me = getpass.getuser()
    asked = once("lend.request", f"node {elastic}")
    assert (asked.outcome, asked.actor, asked.unix_user) == ("ok", me, me)
    assert asked.detail == f"request {good.id}: models busy"
    lent = once("lend", f"node {elastic}")  # written with the lease
    assert lent.outcome == "ok" and lent.actor == rec.audit.actor.name
    assert lent.detail == f"lease {lease.id}: operator request {good.id} by {me}"
    done = once("request.done", f"request {good.id}")
    assert done.detail == f"request {good.id}: lend node {elastic}: {outcomes[good.id]}"
    assert [e.target for e in entries if e.action == "lend"] == [f"node {elastic}"]
    assert once("request.done", f"request {bad[0].id}").outcome == "refused"
    assert once("request.done", f"request {bad[1].id}").outcome == "refused"
    asked_back = [
        e for e in entries if (e.action, e.target) == ("return.request", f"lease {lease.id}")
    ]
    assert [e.actor for e in asked_back] == [me, me]  # stb return, then again
    back = once("return", f"lease {lease.id}")  # written with its first move
    assert back.detail.startswith(f"lease {lease.id} serving -> draining: operator request")
    assert once("request.done", f"request {again.id}").outcome == "refused"  # again
    assert once("pool.drain", "pool training").detail.endswith(": audit")
    assert once("pool.resume", "pool training").outcome == "ok"
    assert "the audit trail holds" in stb("audit", "verify")
    assert "the audit trail agrees" in stb("audit", "check")
    # ... and a changed entry breaks the chain there, until it is put back
    forged = once("request.done", f"request {bad[1].id}").seq
    put = text("UPDATE audit_entry SET outcome = :o WHERE seq = :s")
    with trail._engine.begin() as conn:
        conn.execute(put, {"o": "ok", "s": forged})
    said = stb("audit", "verify", code=1)
    assert f"broken at entry {forged} " in said and "do not match its hash" in said
    assert f"broken at entry {forged}" in stb("audit", "check", code=1)
    with trail._engine.begin() as conn:
        conn.execute(
            text("UPDATE audit_entry SET outcome = 'refused' WHERE seq = :s"), {"s": forged}
        )
    assert "the audit trail holds" in stb("audit", "verify")
