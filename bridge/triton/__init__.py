"""The Triton adapter: what the daemon knows about Triton Inference Server instances.

`protocol` states the contract (`TritonInstance`), `client` implements it on tritonclient
(HTTP) and httpx (the metrics page), `errors` classifies failures (transient or permanent),
`metrics` parses a Prometheus page into immutable per-model samples, and `signal` turns two
samples into the latency and load signal the policy reads (pure, no I/O). `repository`
reads the model repository's config.pbtxt files (the bridge's metadata in their
parameters), and `catalog` merges each model's facts with the TOML's overrides
(`bridge.modelfacts`).
"""
