"""`stb db upgrade`: create or upgrade the bridge's database and the ledger to the schema
this stb needs, each under the database's schema lock (`bridge.db.schema_lock`), so it is
safe while daemons on other hosts start. The daemon itself only creates a new database:
an older one stops it with the message that names this command. Thin: calls
`bridge.leases.schema` and `accounting.db`, prints one line per schema.
"""

from __future__ import annotations

import typer
from rich.console import Console

from accounting import db as ledger_db
from bridge.cli_text import fail, say
from bridge.config_cli import ConfigOpt, load_or_exit
from bridge.db import SchemaError, make_engine, redacted
from bridge.leases import schema as bridge_schema

console = Console()
db_app = typer.Typer(
    help="The schema of the bridge's database and of the ledger.", no_args_is_help=True
)


@db_app.command()
def upgrade(config: ConfigOpt = None) -> None:
    """Bring the bridge's database (database_url) and the ledger (accounting.ledger_url)
    to the latest schema, under the database's schema lock. A bridge database made before
    its migrations is checked and stamped; a schema newer than this stb is refused and
    left as it is."""
    cfg = load_or_exit(config)
    steps = (
        (bridge_schema.BRIDGE.what, cfg.database_url, bridge_schema.upgrade),
        (ledger_db.LEDGER.what, cfg.accounting.ledger_url, ledger_db.ensure),
    )
    for what, url, run in steps:
        engine = make_engine(url)
        try:
            change = run(engine)
        except SchemaError as exc:
            raise fail(exc) from exc
        finally:
            engine.dispose()
        say(console, f"{what} at {redacted(url)}: {change.line()}")
