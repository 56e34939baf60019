"""The bridge's side of the GPU-hour ledger: what `accounting` (the pure ledger) needs from
the bridge's configuration, Slurm, the lease store and the model repository.

- `feed`: one ingest of a window (`stb accounting ingest`, the daemon's scheduled ingest);
- `sreport`: the ledger against sreport, hour by hour (`stb accounting agree`);
- `limits`: team budgets Slurm enforces (GrpTRESMins on the team's account);
- `views`, `lending`, `replica_plan`: the sections shown beside a report (lending and what
  its transitions cost; which models need long-term replicas);
- `cli`, `budget_cli`: `stb accounting`, `stb report` and `stb budget`.
"""
