"""Routing: publishes the ready Triton replicas per model to nginx (an upstream file and a
graceful reload) and as a Prometheus http_sd document.

`table` is the pure value the daemon builds each tick; `nginx` and `http_sd` render it;
`nginxctl` installs a rendered file into a running nginx; `publisher` does both in order.
`batchlog` counts the batch route's requests from nginx's batch access log.
"""
