"""The lab tests' fixtures that wire the bridge's parts to the lab (not a test module):
`pg_database` (a scratch PostgreSQL database), `triton_config` (the Triton job settings; a
test module may override it), `bridge` (a Reconciler on the lab, its own nginx and SQLite
lease store, driven by `run_once`) and `daemon_config` (a TOML for a real `stb daemon`),
`audit_agrees` (autouse: after each test, every bridge database it left holds an audit
trail that agrees with what it records, `bridge.audit.check`: issue 33's "every
privileged action in the lab test suite appears once in the audit trail"), and
`with_mig_node` (the lab with its node of MIG slices for one module, then as it was).
tests/lab/conftest.py and tests/faults/conftest.py import them, so both folders share one
copy.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import inspect

from bridge.audit.check import reconcile
from bridge.config import TritonJobConfig, load_config
from bridge.daemon.clients import TritonClients
from bridge.daemon.observe import Observer
from bridge.daemon.reconciler import Reconciler
from bridge.lab import lab as lab_mod
from bridge.lab import triton
from bridge.lab.demo import daemon_toml
from bridge.lab.pair import NoPostgres, scratch_database
from bridge.lab.spec import MIG_PROFILES, LabSpec
from bridge.leases.requests import RequestQueue
from bridge.leases.store import LeaseStore, create_schema, make_engine
from bridge.paths import project_root
from bridge.routing import nginx
from bridge.routing.nginxctl import NginxProcess
from bridge.routing.publisher import RoutingPublisher
from bridge.slurm.cli import SlurmCLI


def with_mig_node(spec: LabSpec) -> Iterator[LabSpec]:
    """The lab with its node of fake MIG slices (`stb lab up --mig`), as a module-scoped
    `lab` fixture yields it: a lab that has none is brought down and up again with one
    (some 10 s), and after the module down and up again as it was, so the tests after
    it see the lab they expect. The MIG tests are marked `last` (they run after the
    rest of the lab's tests): nothing else sees the fifth node or the restarts."""
    current = LabSpec.load(spec.lab_dir) or spec
    if current.mig_nodes:
        yield current
        return
    mig = replace(current, mig_profiles=MIG_PROFILES)
    try:  # (a bring-up that fails part way is taken down and the lab restored too)
        lab_mod.down(current, say=print)
        lab_mod.up(mig, say=print)
        yield mig
    finally:
        lab_mod.down(mig, say=print)
        lab_mod.up(current, say=print)


def _disagreements(url: str) -> list[str]:
    """What `bridge.audit.check` finds in the bridge database at `url` (none where it
    holds no audit trail: a ledger, an advisory record)."""
    engine = make_engine(url)
    try:
        if "audit_entry" not in inspect(engine).get_table_names():
            return []
        return reconcile(engine).findings
    finally:
        engine.dispose()


def _agree(where: str, url: str) -> None:
    found = _disagreements(url)
    if found:
        pytest.fail(f"the audit trail of {where} disagrees:\n" + "\n".join(found))


def trails_agree(root: Path) -> None:
    """Each SQLite database under `root` that holds an audit trail agrees with it."""
    for path in sorted(root.rglob("*.db")):
        _agree(str(path.relative_to(root)), f"sqlite:///{path}")


@pytest.fixture(autouse=True)
def audit_agrees(tmp_path: Path) -> Iterator[None]:
    """After the test (and its fixtures' teardown): each SQLite database under its
    tmp_path that holds an audit trail agrees with it, each action once."""
    yield
    trails_agree(tmp_path)


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A new scratch PostgreSQL database's URL, dropped afterwards (its audit trail
    checked first, as `audit_agrees` checks SQLite's); the test is skipped where no
    PostgreSQL answers."""
    try:
        with scratch_database() as url:
            yield url
            _agree("the scratch PostgreSQL database", url)
    except NoPostgres as exc:
        pytest.skip(str(exc))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def triton_config(lab: LabSpec) -> TritonJobConfig:
    """The Triton job settings of the `bridge` fixture; a test module may override this
    fixture (e.g. to serve a model repository of its own)."""
    return triton.job_config(lab)


@pytest.fixture
def bridge_update() -> dict[str, object]:
    """More of the `bridge` fixture's configuration, field -> value (e.g. `weights`;
    `policy`: a dict of [policy] fields set beside the fixture's own); a test module may
    override this fixture."""
    return {}


@pytest.fixture
def bridge(
    lab: LabSpec,
    tmp_path: Path,
    triton_config: TritonJobConfig,
    bridge_update: dict[str, object],
) -> Iterator[tuple[Reconciler, str]]:
    base = load_config(project_root() / "deploy" / "lab" / "bridge.toml")
    port = _free_port()
    more = dict(bridge_update)
    policy_more = more.pop("policy", {})  # [policy] fields beside the fixture's own
    assert isinstance(policy_more, dict), "bridge_update's policy: a dict of its fields"
    config = base.model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'bridge.db'}",
            "triton": triton_config,
            "policy": base.policy.model_copy(
                update={
                    "breach_evaluations": 2,
                    "return_dwell_s": 6,
                    "scale_out_cooldown_s": 0,
                    "scale_in_cooldown_s": 6,
                    "max_lent_nodes": 1,
                    **policy_more,
                }
            ),
            **more,
        }
    )
    engine = make_engine(config.database_url)
    create_schema(engine)
    clients = TritonClients(triton.api_key(lab))

    proc = NginxProcess(tmp_path / "nginx")
    proc.start()
    publisher = RoutingPublisher(
        proc.routing_conf,
        tmp_path / "http_sd.json",
        proc.control,
        settings=nginx.NginxSettings(
            listen=f"127.0.0.1:{port}",
            batch_log=str(config.batch.access_log.resolve()) if config.batch.enabled else None,
        ),
    )
    cli = SlurmCLI(env=lab.env())
    rec = Reconciler(
        config,
        cli,
        LeaseStore(engine),
        Observer(cli, config, clients),
        clients,
        publisher,
        requests=RequestQueue(engine),
        forget_triton=clients.forget,
    )
    try:
        yield rec, f"127.0.0.1:{port}"
    finally:
        proc.stop()
        clients.close()
        for job in cli.jobs(tag="stb:triton"):
            cli.cancel(job.job_id)
        for resv in cli.reservations():
            if resv.name.startswith("stb-lease-"):
                cli.delete_reservation(resv.name)


@pytest.fixture
def daemon_config(lab: LabSpec, tmp_path: Path) -> Iterator[Path]:
    """A bridge TOML for a `stb daemon` subprocess: lab Triton paths, everything else
    (database, nginx, exporter port, lock) under tmp_path."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nginx_port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        exporter_port = s.getsockname()[1]
    path = tmp_path / "bridge.toml"
    path.write_text(
        daemon_toml(
            lab, tmp_path, listen=f"127.0.0.1:{nginx_port}", exporter=f"127.0.0.1:{exporter_port}"
        )
    )
    yield path
    nginx_pid = tmp_path / "nginx" / "run" / "nginx.pid"
    if nginx_pid.exists():
        subprocess.run(
            [
                "nginx",
                "-p",
                str(tmp_path / "nginx"),
                "-c",
                str(tmp_path / "nginx" / "conf" / "nginx.conf"),
                "-s",
                "quit",
            ],
            capture_output=True,
            check=False,
        )
