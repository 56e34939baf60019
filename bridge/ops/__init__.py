"""The operator's command line against a bridge: `stb daemon` (run it, or its advisory mode),
`stb status`, `stb lend`, `stb return`, `stb drain`, `stb resume` and `stb token`. Thin:
parses options, calls the daemon's service, the lease store, the request queue and the
API, prints."""
