"""The run config, typed: `fields.py` (allowed values, the settings launchers share),
`sections.py` (one frozen dataclass per concern), `run.py` (the whole config, its defaults and
what it builds) and `edge.py` (built from the command line's ConfigDict with the method
registry's rules). Nothing is imported here, so the base layer can import `fields` alone."""
