"""The trail's entries as text to ship off the host: JSON lines (`jsonl`, every field,
the hashes included, so a copy can be verified on its own) or RFC 5424 syslog lines
(`syslog`: facility authpriv, severity notice for ok and warning otherwise, the fields
as structured data). Both go to stdout (`stb audit export`): pipe them to the site's
forwarder (rsyslog's imfile, `logger -n HOST --rfc5424` per line, a log shipper)."""

from __future__ import annotations

import json
from typing import Any

from bridge.leases.audit import AuditEntry

FORMATS = ("jsonl", "syslog")
#: authpriv (10): security and authorization messages that carry private detail
FACILITY = 10
#: notice (5) for an ok action, warning (4) for a refused or failed one
SEVERITY = {"ok": 5, "refused": 4, "failed": 4}
#: the structured data's id: name@private-enterprise-number (32473: the example number
#: RFC 5424 reserves for documentation; a site may set its own)
SD_ID = "stb@32473"


def to_json(entry: AuditEntry) -> dict[str, Any]:
    """One entry as a JSON object: every stored field, the time in ISO 8601 UTC."""
    doc = entry.model_dump()
    doc["at"] = entry.at.isoformat(timespec="microseconds")
    return doc


def jsonl(entry: AuditEntry) -> str:
    return json.dumps(to_json(entry), sort_keys=True, ensure_ascii=False)


def _param(value: object) -> str:
    """An SD-PARAM value: `"`, `\\` and `]` escaped (RFC 5424 section 6.3.3)."""
    text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]")


def _token(text: str | None, limit: int) -> str:
    """A header field: printable US-ASCII without spaces, at most `limit` characters;
    `-` when empty."""
    out = "".join(c if 33 <= ord(c) <= 126 else "_" for c in (text or ""))[:limit]
    return out or "-"


def syslog(entry: AuditEntry) -> str:
    """One RFC 5424 line: `<PRI>1 TIMESTAMP HOST stb - ACTION [stb@32473 ...] MESSAGE`."""
    pri = FACILITY * 8 + SEVERITY.get(entry.outcome, 4)
    fields = {
        "seq": entry.seq,
        "outcome": entry.outcome,
        "actor": entry.actor,
        "target": entry.target,
        "token": entry.token,
        "unix_user": entry.unix_user,
        "slurm_job": entry.slurm_job,
        "epoch": entry.epoch,
        "prev_hash": entry.prev_hash,
        "hash": entry.hash,
    }
    sd = " ".join(f'{k}="{_param(v)}"' for k, v in fields.items() if v is not None)
    message = f"{entry.actor} {entry.action} {entry.target}: {entry.outcome}"
    if entry.detail:
        message += f" ({entry.detail})"
    message = " ".join(message.split())  # one line, whatever the detail held
    return (
        f"<{pri}>1 {entry.at.isoformat(timespec='microseconds')} {_token(entry.host, 255)} "
        f"stb - {_token(entry.action, 32)} [{SD_ID} {sd}] {message}"
    )


def line(entry: AuditEntry, fmt: str) -> str:
    """`entry` in format `fmt` (one of `FORMATS`)."""
    if fmt == "jsonl":
        return jsonl(entry)
    if fmt == "syslog":
        return syslog(entry)
    raise ValueError(f"unknown export format {fmt!r}: one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "jsonl", "line", "syslog", "to_json"]
