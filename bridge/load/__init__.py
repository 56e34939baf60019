"""The load generator behind `stb load`: arrival schedules (`arrivals`), an open-loop
async sender (`runner`), the summary (`report`) and the command (`cli`); for LLMs, token
streams (`streams`, their events parsed by `sse`, their lengths from `lengths`, their
summary `stream_report`, the `--stream` half of the command `stream_cli`).

Demos, end-to-end tests and benchmarks use it to make Triton's latency rise. It sends
load only to loopback addresses, always bounded in request count and duration.
"""
