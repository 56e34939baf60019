"""`stb advise ...`: what the advisory daemon (`stb daemon --advise`) recorded, summarised,
and the same window replayed through the simulator with and without lending.

A tool beside the runtime (it may import the simulator; the daemon may not): `summary`
reads the advisory's tables (`bridge.leases.advice`) into plain figures, `replay` builds
the simulator's set-ups from them, Slurm's nodes and sacct, and `cli` prints both."""
