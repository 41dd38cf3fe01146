"""A collective across the processes of `launch/local_cluster.py` (tests/test_multihost.py).

Each process contributes its local devices' values 100 * process + local device; prints the
global sum, computed by one jitted reduction over all devices of all processes.
"""

import time

t0 = time.time()
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from setdiff_jax import sharding  # noqa: E402

sharding.initialize_distributed()
t_init = time.time() - t0
mesh = jax.make_mesh((jax.device_count(),), ("d",), devices=jax.devices())
local = np.arange(jax.local_device_count(), dtype=np.float32) + 100 * jax.process_index()
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, P()))(x)
print(
  f"process {jax.process_index()} of {jax.process_count()}: devices {jax.device_count()} "
  f"local {jax.local_device_count()} sum {float(total):g} init_s {t_init:.2f}",
  flush=True,
)
