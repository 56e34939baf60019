"""The fleet's mode (issue 33's migration path between separate and shared fleets): what
each mode makes the daemon do (`mode`), the figures taken at each switch (`baseline`),
and `stb fleet` (`cli`)."""
