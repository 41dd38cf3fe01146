"""Experiments whose results cannot drift: run records from clean commits on main's history
(`record`), seed-aware intervals and a many-comparisons rule (`stats`), the generated result
tables under docs/results (`publish`) and a rerun compared with the record before it
(`reproduce`). Git queries live in `git`."""
