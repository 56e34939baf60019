"""The daemon's HTTP surface: metrics, health, routing targets and the operator API, on
FastAPI served by uvicorn.

- `app`: the app (`create_app`): /metrics, /healthz, /sd, /openapi.json and the routers;
- `routes`: the operator's and finance's routes (`operator_routes`, `finance_routes`);
- `guard`: the bearer dependency (token, role, request bounds), body reader, error answers;
- `auth`: the tokens file and roles (no web framework: `stb token` uses it too);
- `server`: uvicorn on a thread, TLS, the request deadline and connection bounds.

It reads the lease store and the request queue and imports nothing of the daemon; the
daemon's service builds the app and starts the server (`bridge.daemon.service`).
"""
