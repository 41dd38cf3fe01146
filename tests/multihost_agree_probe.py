"""Run by tests/test_multihost.py on a 2-process local cluster: the agreement primitives
(`sharding.agree`, `stopping.StopAgreement`, the checkpoint verdict of `fallback`) with one
process seeing something the other does not. Prints one `ok ...` line per check."""

import os
import signal

import jax

from setdiff_jax import errors, sharding
from setdiff_jax.workdir import fallback, stopping

sharding.initialize_distributed()
me, count = jax.process_index(), jax.process_count()
assert count == 2

# Rounds of one name meet in order; the values come back in process order.
for r in range(3):
  got = sharding.agree("probe", f"r{r}p{me}")
  assert got == [f"r{r}p0", f"r{r}p1"], got
print("ok agree", me, flush=True)


class FakePreemption:  # what stopping.Preemption records (no real signal in this probe)
  requested, signum = False, None

  @property
  def name(self):
    return signal.Signals(self.signum).name if self.signum else "a signal"


# A signal to process 1 only: both stop, naming it.
pre = FakePreemption()
if me == 1:
  pre.requested, pre.signum = True, signal.SIGTERM
stop = stopping.StopAgreement(pre)
assert stop.agree() == "SIGTERM (to process 1)" and pre.requested and pre.signum == 15
print("ok signal", me, flush=True)

# A non-finite loss seen by process 1 only: both raise it, process 0 naming process 1; the
# cleanup runs on both first.
stop = stopping.StopAgreement(FakePreemption())
cleaned = []
stop.on_error = lambda: cleaned.append(True)


def check(step):
  if me == 1:
    raise FloatingPointError(f"non-finite training metrics at step {step}")


stop.check(check, 4)
try:
  stop.agree()
  raise AssertionError("no error")
except FloatingPointError as e:
  assert "non-finite training metrics at step 4" in str(e) and cleaned == [True], str(e)
  assert ("process 1 of 2" in str(e)) == (me == 0), str(e)
print("ok error", me, flush=True)

# A checkpoint step process 0 alone finds damaged: both treat it as damaged.
damage = errors.DamagedCheckpointError("step 6: bad file") if me == 0 else None
try:
  fallback._agreed(6, damage)
  raise AssertionError("no error")
except errors.DamagedCheckpointError as e:
  assert "step 6: bad file" in str(e) and ("found by process 0" in str(e)) == (me == 1), str(e)
fallback._agreed(3, None)  # both fine: nobody raises
print("ok checkpoint", me, flush=True)

# The tokenizer of a first run: process 0 builds and saves it, the others check they see the
# same files and read them; a process that sees another workdir (not shared) stops all.
from setdiff_jax.data import tokenizers  # noqa: E402
from setdiff_jax.config import run as run_config  # noqa: E402
from setdiff_jax.workdir.tokenizer import build_tokenizer  # noqa: E402

c = run_config.default_config()
c.tokenizer.kind, c.tokenizer.lowercase = "wordpiece", True
c.tokenizer.vocab_path = tokenizers.packaged_vocab("bert-base-uncased/vocab.txt")
shared = os.path.join(os.environ["PROBE_DIR"], "shared")
tok = build_tokenizer(c, shared)
assert sharding.agree("vocab", str(tok.vocab_size)) == ["30522", "30522"]
assert tokenizers.saved_in(shared)
elsewhere = os.path.join(os.environ["PROBE_DIR"], f"own{me}")  # each its own: not shared
try:
  build_tokenizer(c, shared if me == 0 else elsewhere)
  raise AssertionError("no error")
except ValueError as e:
  assert "process 1 of 2 does not see the tokenizer process 0 saved" in str(e), str(e)
  assert "nothing there" in str(e)
assert not tokenizers.saved_in(elsewhere)  # nothing trained or written by process 1
print("ok tokenizer", me, flush=True)

# A resume where every host has its own copy of the workdir (identical files, an earlier start's
# token included) hung at the first save; now every process stops at the start, named.
from setdiff_jax.trainer import session  # noqa: E402

session.check_shared_workdir(shared)  # one workdir: nothing to say
copy = os.path.join(os.environ["PROBE_DIR"], f"copy{me}")
os.makedirs(os.path.join(copy, ".lock"))
with open(os.path.join(copy, ".lock", session.START_FILE), "w") as f:
  f.write("an earlier start's token")
for workdir, what in ((copy, "another start token there"), (elsewhere, "nothing there")):
  try:
    session.check_shared_workdir(shared if me == 0 and workdir == elsewhere else workdir)
    raise AssertionError("no error")
  except ValueError as e:
    assert "process 1 of 2 does not see the file process 0 wrote" in str(e), str(e)
    assert what in str(e) and "not a copy per host" in str(e), str(e)
print("ok workdir", me, flush=True)

# Processes started with different configs (probe round 13: process 0's config.json recorded,
# process 1 trained at its own learning rate): every process stops at the start, naming fields.
session.check_same_config(run_config.default_config())  # the same config: nothing to say
c1 = run_config.default_config()
if me == 1:
  c1.learning_rate, c1.num_train_steps = 0.3, 8
try:
  session.check_same_config(c1)
  raise AssertionError("no error")
except ValueError as e:
  assert "started with different configs" in str(e), str(e)
  assert "process 1: learning_rate, num_train_steps)" in str(e), str(e)
print("ok config", me, flush=True)

# Bounded: a round process 1 never joins ends in TimeoutError on process 0.
if me == 0:
  try:
    sharding.agree("lonely", "x", timeout_s=1)
    raise AssertionError("no timeout")
  except TimeoutError as e:
    assert "'lonely'" in str(e) and "1s" in str(e), str(e)
sharding.barrier("probe done", timeout_s=60)
print("ok bounded", me, flush=True)
