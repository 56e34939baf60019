"""Publish a `RoutingTable`: nginx first, then the service-discovery document.

Called by the daemon's act step each tick (and before a return: a replica leaves routing
by publishing the table without it, and the reload has taken effect when `publish`
returns). Idempotent: a table that renders to what was last published writes nothing and
reloads nothing. The first publish of a process always tests and reloads, since a crash
of an earlier daemon may have left a file nginx never loaded.

Errors (from `bridge.routing.errors`): `NginxConfigRejected` (permanent: the previous
routing keeps serving; the document is not written either, so the two never disagree),
`NginxUnavailable` (transient: retry next tick; the next publish reloads again),
`RoutingFilesUnwritable` (transient: a file could not be written; nothing reloaded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.routing import http_sd, nginx
from bridge.routing.errors import RoutingFilesUnwritable
from bridge.routing.nginxctl import NginxControl
from bridge.routing.table import RoutingTable


@dataclass(frozen=True)
class PublishResult:
    version: str
    """The table's version."""
    nginx_changed: bool
    """The routing file was replaced and nginx reloaded."""
    sd_changed: bool
    """The service-discovery document was rewritten."""
    reload_s: float | None
    """Seconds from SIGHUP until new workers ran and no old one accepted, when it
    reloaded (about 0.1 s: nginx's master waits 100 ms before telling old workers to quit)."""


class RoutingPublisher:
    """Owns the nginx routing file at `nginx_conf_path` and the document at `sd_path`."""

    def __init__(
        self,
        nginx_conf_path: Path,
        sd_path: Path,
        control: NginxControl,
        *,
        settings: nginx.NginxSettings | None = None,
        bridge_metrics: str | None = None,
        render: Callable[[RoutingTable, nginx.NginxSettings], str] = nginx.render,
    ) -> None:
        self.nginx_conf_path = nginx_conf_path
        self.sd_path = sd_path
        self.control = control
        self.settings = settings or nginx.NginxSettings()
        self.bridge_metrics = bridge_metrics
        self._render = render
        self._lock = threading.Lock()  # one publish at a time (tick vs operator CLI)
        self._published_nginx: str | None = None
        self._document = http_sd.render(RoutingTable(), bridge_metrics)
        #: the last table nginx routes (None before the first publish): the activator
        #: forwards a held request once its model has a ready replica here
        self.table: RoutingTable | None = None

    def document(self) -> bytes:
        """The last published service-discovery document (for the daemon's HTTP server)."""
        return self._document

    def publish(self, table: RoutingTable) -> PublishResult:
        """Make nginx route `table` (reloaded and in effect on return), then write the
        document. Raises NginxConfigRejected or NginxUnavailable (module docstring)."""
        with self._lock:
            return self._publish(table)

    def _publish(self, table: RoutingTable) -> PublishResult:
        text = self._render(table, self.settings)
        reload_s: float | None = None
        nginx_changed = text != self._published_nginx
        if nginx_changed:
            try:
                self.control.install(self.nginx_conf_path, text)
            except OSError as exc:
                raise RoutingFilesUnwritable(f"cannot write {self.nginx_conf_path}: {exc}") from exc
            reload_s = self.control.reload()
            self._published_nginx = text
        self.table = table
        data = http_sd.render(table, self.bridge_metrics)
        try:
            sd_changed = http_sd.write(self.sd_path, data)
        except OSError as exc:
            raise RoutingFilesUnwritable(f"cannot write {self.sd_path}: {exc}") from exc
        self._document = data
        return PublishResult(table.version, nginx_changed, sd_changed, reload_s)
