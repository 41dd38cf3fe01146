"""Experiments whose results cannot drift: run records from clean commits on main's history
(`record`; the checkout, commit and measured paths a record names: `provenance`), seed-aware
intervals and a many-comparisons rule (`stats`), the generated result tables under docs/results
(`publish`), a record regenerated at HEAD (`rerun`) and compared with the one before it
(`reproduce`). Git queries live in `git`."""
