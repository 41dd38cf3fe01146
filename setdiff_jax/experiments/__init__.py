"""Experiments whose results cannot drift: run records from clean commits on main's history
(`record`), seed-aware intervals and a many-comparisons rule (`stats`), and the generated result
tables under docs/results (`publish`). Git queries live in `git`."""
