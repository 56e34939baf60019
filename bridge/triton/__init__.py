"""The Triton adapter: what the daemon knows about Triton Inference Server instances.

`protocol` states the contract (`TritonInstance`), `client` implements it on tritonclient
(HTTP) and httpx (the metrics page), `errors` classifies failures (transient or permanent),
`metrics` parses a Prometheus page into immutable per-model samples, and `signal` turns two
samples into the latency and load signal the policy reads (pure, no I/O).
"""
