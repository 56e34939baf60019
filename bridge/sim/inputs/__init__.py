"""The site's own data as the simulator's inputs, so `stb simulate` answers "shared or
separate?" on a site's fleet, jobs and load rather than on the public traces.

Called by `stb simulate` (`bridge.sim.cli`), which records each reader's `about` (where
the input came from, what was left out and why) in the report's scenario. Every reader
returns the simulator's own types: `SimJob`s, an `ArrivalSeries`, a `Timing`, the
fleet's shape (`FleetShape`: its nodes, GPUs and pools). The functions that turn data
into those types are pure; the few that fetch it say so in their names (`read_*`,
`query_*`, `*_files`): a file, a Prometheus server over HTTP, the bridge's database.
One module per source:

- `jobs`: batch jobs from `sacct --json --duplicates` (`replay_records`), replayed as
  they came: requeued runs, arrays, multi-node and still-running jobs as the docstring
  says; the bridge's Triton servers are serving, not batch work, and are left out.
- `ledger_jobs`: the same jobs from the GPU-hour ledger (`replay_ledger`: the runs it
  booked, through `jobs`' rules), for a site whose slurmdbd purged them; they arrive at
  their first run's start (the ledger keeps no submit time), as the docstring says.
- `arrivals`: per model, the request rate over time as it happened, resampled to the
  simulator's step with its gaps said (`resample`); a CSV of `time,model,rate`.
- `prometheus`: the same from a Prometheus range query (`query_range`) or a saved
  answer of that API (`arrivals_from_prometheus`).
- `service`: per-model service times from Triton's compute and success counters,
  through Prometheus or from the samples the daemon stored in the ledger.
- `fleet`: the nodes, their GPUs and the bridge's pool of each, from `scontrol show node
  -o` / `show partition -o`.
- `timing`: actuation times (`Timing`) from the bridge's lease history, medians with the
  count of leases they come from; the bench's defaults for the rest.
- `loads`: the models' load times and the node-local weight caches (`--load-s`,
  `--cache`), with `--timing leases` from the loads the daemon measured and stored
  (`load_timing`, `read_load_measures`).

Bad input raises `InputError` (a ValueError) naming the file or source, the field and
the line or item that was wrong; the CLI prints it as one line and exits 2.
"""

from bridge.sim.inputs.arrivals import MAX_GAP_S, Samples, arrivals_from_csv, resample
from bridge.sim.inputs.common import InputError, open_database, parse_time
from bridge.sim.inputs.fleet import FleetNode, FleetShape, fleet_from_scontrol, read_fleet
from bridge.sim.inputs.jobs import (
    JobReplay,
    jobs_from_records,
    jobs_from_sacct_files,
    partition_kinds,
    read_sacct_files,
    record_span,
    replay_records,
    replay_sacct_files,
)
from bridge.sim.inputs.ledger_jobs import replay_ledger
from bridge.sim.inputs.loads import load_timing, read_load_measures
from bridge.sim.inputs.prometheus import (
    DEFAULT_QUERY,
    arrivals_from_prometheus,
    prometheus_samples,
    query_instant,
    query_range,
)
from bridge.sim.inputs.service import (
    read_ledger_service,
    service_from_increases,
    service_from_prometheus,
    service_query,
)
from bridge.sim.inputs.timing import lend_modes, read_lease_timelines, timing_from_leases

__all__ = [
    "DEFAULT_QUERY",
    "MAX_GAP_S",
    "FleetNode",
    "FleetShape",
    "InputError",
    "JobReplay",
    "Samples",
    "arrivals_from_csv",
    "arrivals_from_prometheus",
    "fleet_from_scontrol",
    "jobs_from_records",
    "jobs_from_sacct_files",
    "lend_modes",
    "load_timing",
    "open_database",
    "parse_time",
    "partition_kinds",
    "prometheus_samples",
    "query_instant",
    "query_range",
    "read_fleet",
    "read_lease_timelines",
    "read_ledger_service",
    "read_load_measures",
    "read_sacct_files",
    "record_span",
    "replay_ledger",
    "replay_records",
    "replay_sacct_files",
    "resample",
    "service_from_increases",
    "service_from_prometheus",
    "service_query",
    "timing_from_leases",
]
