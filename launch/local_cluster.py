"""Run any launcher as an N-process JAX cluster on this machine (multi-host, tested on one box).

  python launch/local_cluster.py --num_processes=2 --devices_per_process=2 -- \
      python launch/train.py --config=configs/tiny_sw.py --workdir=/tmp/tiny2

Starts N copies of the command. Process i gets K CPU devices (`JAX_NUM_CPU_DEVICES`), gloo CPU
collectives (`JAX_CPU_COLLECTIVES_IMPLEMENTATION`), few compute threads, and the cluster in
`SETDIFF_COORDINATOR_ADDRESS=127.0.0.1:PORT`, `SETDIFF_NUM_PROCESSES=N`, `SETDIFF_PROCESS_ID=i`,
which `setdiff_jax.sharding.initialize_distributed()` (called first by every launcher) reads, so
the N processes form one JAX cluster of N x K devices exactly as the hosts of a pod do.

Every output line of process i is printed as `[pi] line`. When a process exits non-zero, the
others are stopped (SIGTERM, then SIGKILL after --grace_s) and this exits with that status, after
one `error:` line naming the process. Every wait is bounded: --timeout (the whole run),
--grace_s, and `$SETDIFF_HEARTBEAT_TIMEOUT_S` (--heartbeat_s: how long a process survives a lost
peer inside JAX before it stops with an error). SIGTERM / SIGINT to this launcher are forwarded
to every process (a preemption of the whole "pod").
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Names read by setdiff_jax.sharding (kept literal here: the launcher never imports jax).
COORDINATOR_ENV = "SETDIFF_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "SETDIFF_NUM_PROCESSES"
PROCESS_ID_ENV = "SETDIFF_PROCESS_ID"
INIT_TIMEOUT_ENV = "SETDIFF_INIT_TIMEOUT_S"
HEARTBEAT_TIMEOUT_ENV = "SETDIFF_HEARTBEAT_TIMEOUT_S"


class _Usage(Exception):
  pass


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one `error:` line instead of argparse's usage block
    raise _Usage(message)


def parse_args(argv: Sequence[str]):
  """Flags before `--`, the command after it."""
  argv = list(argv)
  asks_help = "--" not in argv and {"-h", "--help"} & set(argv)  # prints the flags, exits 0
  if "--" not in argv and not asks_help:
    raise _Usage(
      "the command to run goes after `--`, e.g. local_cluster.py --num_processes=2 "
      "-- python launch/train.py --config=configs/tiny_sw.py --workdir=DIR"
    )
  cut = argv.index("--") if "--" in argv else len(argv)
  parser = _Parser(prog="local_cluster.py", add_help=True)
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=1)
  parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  parser.add_argument(
    "--timeout",
    type=float,
    default=3600.0,
    help="seconds the whole run may take; then every process is killed",
  )
  parser.add_argument(
    "--grace_s",
    type=float,
    default=20.0,
    help="seconds between SIGTERM and SIGKILL when stopping the processes",
  )
  parser.add_argument(
    "--init_timeout_s",
    type=int,
    default=120,
    help="seconds the processes wait for each other to join",
  )
  parser.add_argument(
    "--heartbeat_s",
    type=int,
    default=30,
    help="seconds after which a silent (lost) process counts as dead",
  )
  parser.add_argument(
    "--threads", type=int, default=1, help="compute threads per process (XLA CPU / OpenMP)"
  )
  args = parser.parse_args(argv[:cut])
  command = argv[cut + 1 :]
  if not command:
    raise _Usage("no command after `--`")
  for name in (
    "num_processes",
    "devices_per_process",
    "timeout",
    "grace_s",
    "init_timeout_s",
    "heartbeat_s",
    "threads",
  ):
    value = getattr(args, name)
    if not value > 0 or value == float("inf"):  # nan and inf too: every wait stays bounded
      raise _Usage(f"--{name}={value} must be a finite number > 0")
  if not 0 <= args.port < 65536:
    raise _Usage(f"--port={args.port} is not a TCP port (0..65535; 0 picks a free one)")
  return args, command


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(base: dict, i: int, args, port: int) -> dict:
  """The environment of process i: its place in the cluster, its devices, few threads."""
  env = dict(base)
  # A forced host device count (e.g. the test suite's 8) would override K devices per process.
  xla = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
  if args.threads == 1 and "xla_cpu_multi_thread_eigen" not in xla:
    xla += " --xla_cpu_multi_thread_eigen=false"
  env.update(
    {
      "XLA_FLAGS": " ".join(xla.split()),
      "JAX_PLATFORMS": "cpu",
      "JAX_NUM_CPU_DEVICES": str(args.devices_per_process),
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "OMP_NUM_THREADS": str(args.threads),
      "MKL_NUM_THREADS": str(args.threads),
      "OPENBLAS_NUM_THREADS": str(args.threads),
      "PYTHONUNBUFFERED": "1",
      COORDINATOR_ENV: f"127.0.0.1:{port}",
      NUM_PROCESSES_ENV: str(args.num_processes),
      PROCESS_ID_ENV: str(i),
      INIT_TIMEOUT_ENV: str(args.init_timeout_s),
      HEARTBEAT_TIMEOUT_ENV: str(args.heartbeat_s),
    }
  )
  return env


def _pump(i: int, stream, lock: threading.Lock):
  """Copies process i's output to ours, each line prefixed `[pi] `."""
  for raw in iter(stream.readline, b""):
    line = raw.decode("utf-8", "replace").rstrip("\n")
    with lock:
      sys.stdout.write(f"[p{i}] {line}\n")
      sys.stdout.flush()
  stream.close()


def _stop(procs: List[subprocess.Popen], grace_s: float):
  """SIGTERM to every live process group, then SIGKILL after `grace_s`."""
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
  deadline = time.time() + grace_s
  while time.time() < deadline and any(p.poll() is None for p in procs):
    time.sleep(0.05)
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      p.wait(timeout=10)


def _die_with_launcher():
  """A `preexec_fn` making each process get SIGTERM when this launcher dies, also by SIGKILL
  (Linux PR_SET_PDEATHSIG; SIGTERM saves and stops a training process): otherwise the processes
  would run on unseen, holding the workdir lock, past --timeout. None where unsupported. The libc
  call is resolved here, before any fork, so the child runs no Python imports."""
  if not sys.platform.startswith("linux"):
    return None
  try:
    import ctypes  # pylint: disable=g-import-not-at-top

    prctl = ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  parent = os.getpid()

  def arm():
    prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the call: act on it now
      os.kill(os.getpid(), signal.SIGTERM)

  return arm


def run(args, command: List[str], env: Optional[dict] = None) -> int:
  """Runs the cluster; returns the exit status (0 when every process exited 0)."""
  port = args.port or free_port()
  base = dict(os.environ if env is None else env)
  lock = threading.Lock()
  procs, pumps = [], []
  forwarded = {"signal": None}

  def forward(signum, frame):
    del frame
    forwarded["signal"] = signum
    for p in procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signum)
        except ProcessLookupError:
          pass

  previous = {
    s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
  }  # a closed terminal (SIGHUP) stops the processes as SIGTERM does; SIGKILL: _die_with_launcher
  arm = _die_with_launcher()
  status, failed = 0, None
  try:
    for i in range(args.num_processes):
      p = subprocess.Popen(
        command,
        env=process_env(base, i, args, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=arm,
      )  # its own group: stopping it stops children
      procs.append(p)
      t = threading.Thread(target=_pump, args=(i, p.stdout, lock), daemon=True)
      t.start()
      pumps.append(t)
    deadline = time.time() + args.timeout
    while True:
      codes = [p.poll() for p in procs]
      bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if bad:
        failed, status = bad[0]
        break
      if all(c == 0 for c in codes):
        break
      if time.time() > deadline:
        failed, status = None, 124
        break
      time.sleep(0.05)
  finally:
    _stop(procs, args.grace_s)
    for t in pumps:
      t.join(timeout=5)
    for s, handler in previous.items():
      signal.signal(s, handler)
  if status == 124 and failed is None:
    print(
      f"error: the cluster did not finish within --timeout={args.timeout:g}s; all "
      f"{args.num_processes} processes were killed",
      file=sys.stderr,
      flush=True,
    )
    return status
  if failed is not None:
    how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
    sig = (
      ""
      if forwarded["signal"] is None
      else (f" after signal {signal.Signals(forwarded['signal']).name} was forwarded")
    )
    print(
      f"error: process {failed} of {args.num_processes} {how}{sig}; the others were "
      f"stopped (command: {shlex.join(command)})",
      file=sys.stderr,
      flush=True,
    )
    return status if status > 0 else 128 - status
  return 0


def main(argv: Sequence[str]) -> int:
  try:
    args, command = parse_args(argv)
  except _Usage as e:
    print(f"error: {e} (see --help)", file=sys.stderr, flush=True)
    return 2
  if shutil.which(command[0]) is None:  # before any process starts: no traceback per process
    print(
      f"error: the command after -- ({command[0]!r}) is not an executable file or on PATH; "
      "give the program each process runs, e.g. -- python launch/train.py ... (see --help)",
      file=sys.stderr,
      flush=True,
    )
    return 2
  return run(args, command)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
