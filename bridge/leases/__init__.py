"""Leases: one node lent to Triton, as a persisted state machine.

The states and the transition table live in `bridge.lifecycle` (pure, shared with the
policy and the simulator); `models` holds the sqlmodel tables; `store` is the one place
that creates leases and changes their status, refusing every move the table forbids. The
reconciler and the operator CLI call the store; nothing here talks to Slurm or Triton (an
import-linter contract checks it).

This package imports nothing on purpose: importing `bridge.leases.errors` pulls in no SQL.
"""
