"""`stb place LEASE MODEL[,MODEL...]`: ask the running daemon to give a serving lease's
replica those models in place of the ones it holds (model placement: the replica keeps
serving; the models it gains are loaded and enter routing once ready, those it drops
leave routing first and are unloaded once their requests in flight are done).

The request is queued in the bridge's database as `stb lend` and `stb return` queue theirs
(`bridge.leases.requests`); the daemon's reconciler carries it out (`bridge.daemon.placer`)
and records the outcome, which this command waits for. Refused here already: an unknown
lease, a lease that is not serving, an unknown model, an empty list. (No `--api` path yet:
the daemon's HTTP API takes lends, returns and holds only.)
"""

from __future__ import annotations

from typing import Annotated

import typer

from bridge.cli_text import say
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.ops.cli import Channel, WaitOpt, _fail, _wait, console
from bridge.triton.catalog import site_models


def place(
    lease: Annotated[int, typer.Argument(help="Lease id of a serving lease (see `stb status`).")],
    models: Annotated[
        str, typer.Argument(help="The models it is to hold, comma-separated: MODEL[,MODEL...].")
    ],
    config: ConfigOpt = None,
    wait: WaitOpt = 30,
) -> None:
    """Ask the running daemon to give serving LEASE the models MODELS in place of those it
    holds: the gained ones loaded, the dropped ones out of routing, then unloaded."""
    cfg = load_or_exit(config)
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        _fail("no model named: stb place LEASE MODEL[,MODEL...]")
    if len(set(names)) != len(names):
        _fail(f"a model is named twice in {','.join(names)}")
    known = site_models(cfg).names
    unknown = sorted(set(names) - set(known))
    if unknown:
        _fail(f"unknown models {', '.join(unknown)}; known: {', '.join(known)}")
    channel = Channel(cfg)
    request_id = channel.place(lease, names)
    say(console, f"request {request_id}: place lease {lease} on {','.join(names)}")
    if wait > 0:
        _wait(channel, request_id, wait)
