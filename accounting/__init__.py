"""The unified GPU-hour ledger: training, elastic work and inference serving booked in
one place, and finance's cost reports. It reads Slurm's accounting and the bridge's
lease history; it never imports the daemon (`bridge`), a rule import-linter checks."""
