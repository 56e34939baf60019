"""The load generator behind `stb load`: arrival schedules (`arrivals`), an open-loop
async sender (`runner`), the summary (`report`) and the command (`cli`).

Demos, end-to-end tests and benchmarks use it to make Triton's latency rise. It sends
load only to loopback addresses, always bounded in request count and duration.
"""
