"""Typed routing errors, classified for the control loop.

Raised by `bridge.routing.table` (invalid names), `bridge.routing.nginxctl` (nginx said
no, or is not running) and `bridge.routing.publisher`; caught by the daemon's act step.
`InvalidRoute` and `NginxConfigRejected` are permanent (the same table gets the same no);
`NginxUnavailable` is transient (nginx is restarting or not started yet: retry next tick),
and so is `RoutingFilesUnwritable` (the routing directory cannot be written now: the old
routing keeps serving; retried every tick until the directory is fixed). Each class says
so in `transient`, which the control loop reads.
"""

from __future__ import annotations


class RoutingError(Exception):
    """Base of the routing errors."""

    transient = False


class InvalidRoute(RoutingError, ValueError):
    """A model name, endpoint or listen address that must not reach nginx's configuration
    (it could inject nginx syntax or is malformed). The message names the value."""


class NginxConfigRejected(RoutingError):
    """Permanent: `nginx -t` refused the rendered configuration; the previous file stays
    in place and nginx keeps serving it. `output` quotes nginx's own words."""

    def __init__(self, path: str, output: str) -> None:
        self.path = path
        self.output = output
        super().__init__(f"nginx rejected the routing configuration {path}: {output}")


class NginxUnavailable(RoutingError):
    """Transient: no running nginx master to reload (missing or stale pid file), or it
    did not start new workers in time. The new file is in place; retry the reload."""

    transient = True


class RoutingFilesUnwritable(RoutingError):
    """Transient: the routing file or the service-discovery document could not be written
    (the directory is missing, not a directory, full or read-only). Nothing was reloaded;
    the previous routing keeps serving. The message names the path and the OS error."""

    transient = True
