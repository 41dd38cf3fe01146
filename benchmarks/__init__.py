"""Benchmark scripts that print tables (see benchmarks/README.md). Run them from the repository
root as modules, `python -m benchmarks.<name> [flags]`: the package, `configs` and the other
benchmarks then import as packages, with no sys.path edits."""
