"""Model delivery: the Triton model repository written safely (`repo`), publishing with
load, check and rollback (`publish`), and `stb models` (`cli`)."""
