"""How many decoding programs have been compiled: the summed jit-cache sizes of the samplers'
jitted loops (set, its no-cache reference, AR, BD3LM, MDLM, MDLM infill, the continuous-batching
loops).

  before = compiled_programs(); ...decode...; new = compiled_programs() - before

A jitted loop holds one cache entry per (static config, input shapes / shardings) it has traced,
so the difference over a decoding run is the number of programs that run compiled (a persistent
compilation cache may turn a compile into a load; it is still counted).
"""

from __future__ import annotations

import importlib

from setdiff_jax.sampling import ar_sampler, baselines, continuous, reference, set_sampler

# (the package's `mdlm_infill` attribute is the function; the module is imported by name)
_infill = importlib.import_module("setdiff_jax.sampling.mdlm_infill")
LOOPS = (
  set_sampler.set_core,
  reference._reference_core,
  ar_sampler.ar_core,
  baselines._bd3lm_core,
  baselines._mdlm_core,
  _infill._mdlm_infill_core,
  *continuous.LOOPS,
)


def compiled_programs() -> int:
  """Programs traced so far by the samplers' jitted loops (all of them, this process)."""
  return sum(int(f._cache_size()) for f in LOOPS)


__all__ = ["compiled_programs", "LOOPS"]
