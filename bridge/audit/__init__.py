"""The audit trail: one append-only, hash-chained log of every privileged action, in the
bridge's database (`bridge.leases.audit`: the table, the chain and its lock).

- `trail`: who acts (`Actor`), the action names (`ACTIONS`) and `Trail`, the one object
  each hook calls (the operator CLI, the HTTP API, the daemon's pass and rollouts, model
  publishing, tokens, the configuration at the daemon's start);
- `export`: the entries as JSON lines or RFC 5424 syslog lines;
- `cli`: `stb audit`, `stb audit export`, `stb audit verify`.
"""
