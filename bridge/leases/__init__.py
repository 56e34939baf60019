"""Leases: one node lent to Triton, as a persisted state machine.

`states` is pure (the enum and the transition table; the policy may import it without
pulling in a database driver); `models` holds the sqlmodel tables; `store` is the one place
that creates leases and changes their status. The reconciler and the operator CLI call the
store; nothing here talks to Slurm or Triton (an import-linter contract checks it).

This package imports nothing on purpose, so `bridge.leases.states` stays free of SQL.
"""
