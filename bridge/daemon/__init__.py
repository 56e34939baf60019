"""The bridge daemon: observe (`observe.py`) -> decide (`bridge.policy`) -> act, each tick.
This package is the only one that joins the adapters, the lease store and the policy."""
