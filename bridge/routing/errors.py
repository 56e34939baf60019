"""Typed routing errors, classified for the control loop.

Raised by `bridge.routing.table` (invalid names), `bridge.routing.nginxctl` (nginx said
no, or is not running) and `bridge.routing.publisher`; caught by the daemon's act step.
`InvalidRoute` and `NginxConfigRejected` are permanent (the same table gets the same no);
`NginxUnavailable` is transient (nginx is restarting or not started yet: retry next tick).
"""

from __future__ import annotations


class RoutingError(Exception):
    """Base of the routing errors."""


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
