"""The fleet simulator: the production policy (`bridge.policy.decide`) drives a
discrete-event model of the fleet (Slurm-like queue, Triton replicas with a queueing latency
model, inference arrivals from traces or generators) in simulated time, so policies can be
compared on a site's own data at sizes the lab cannot reach. `stb simulate` runs it.

Modules: `workload` (arrival series and job lists from traces and generators), `inputs`
(the same from a site's own data: sacct, Prometheus or a CSV, scontrol listings, the
lease history), `latency`
(the replica queueing model), `fleet` (nodes, partitions, the job queue), `engine` (the
event loop: ticks, the lease state machine, decide), `policies` (the compared set-ups and
their sizing, and the selection report's trade-off runs), `result` (what a run reports),
`render` (table, JSON, HTML), `selection` (shared or separate: the dimensions per set-up,
the recommendation and its flips), `selection_render` (the selection as tables, markdown
and a section of the HTML page), `cli` (the command), `labcheck` (the lab scenario's twin
and the decision-by-decision comparison), `weights` and `cache_option` (the node-local weight
caches, and `--cache`'s value).
"""
