"""Node-local copies of model weights: the mechanics of the weight cache.

A lendable node keeps copies of model versions under its cache root, laid out as
`<cache_root>/<model>/<version>/` (the version's files as in the shared model repository,
plus the manifest `stb-weights.json`), so a lent Triton replica loads them from local disk
instead of the shared file system.

- `manifest`: the manifest (per file its path, size and sha256; a digest over the list),
  written beside a version in the shared repository at publish, and `verify`, which checks
  a copy against it before anything uses it;
- `stage`: copying a version from the shared repository (a folder, or an http(s) origin)
  throttled to a bandwidth, into a hidden partial folder, verified, then renamed into
  place; eviction; `python -m bridge.weights.stage` is what a staging Slurm job runs;
- `overlay`: what the Triton job runs at its start: a job-local repository that points
  each model version at its verified local copy, else at the shared repository, and says
  which (`python -m bridge.weights.overlay`);
`stb weights status | stage | verify | evict | manifest` is `bridge.weights_cli`.

Which versions a node should hold is the policy's (`bridge.policy.weights`); the
catalogue of copies is the lease database's (`bridge.leases.weights`).
"""
