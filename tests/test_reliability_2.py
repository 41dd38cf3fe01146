"""Nothing lost, nothing silently wrong, round two (issue 36): each case of the probe as a test,
and the classes behind them: every data-path flag used or refused on every data source, report
headers built from the setting the run used, one range table for every launcher, one line for
storage and disk failures.

Two tiny runs are trained in-process once (an embedded-corpus run and a text-file run); launcher
command lines run through tests/cli_harness.py (one process per launcher) and fail before any
model is built, so the default tier stays cheap; the cases that train, export or decode through
a launcher are in the slow tier.
"""

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from setdiff_jax import cli, cli_signals, decoders, decoding, errors, train
from setdiff_jax.config import fields as ranges
from setdiff_jax.data import data_flags, pipeline, sources
from setdiff_jax.evaluation import generation
from setdiff_jax.evaluation import results as results_lib
from setdiff_jax.evaluation import run as eval_run
from setdiff_jax.sampling import policies
from setdiff_jax.sampling.config import CommitPolicy, SamplerConfig, commit_policy
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import load as workdir_lib

from test_reliability import REPO, assert_one_error_line, env, tiny_args, tiny_config

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A 2-step embedded-corpus run (checkpoints 1 and 2), trained in-process."""
  workdir = str(tmp_path_factory.mktemp("rel2") / "w")
  assert train.train_and_evaluate(tiny_config(), workdir)["step"] == 2
  return workdir


def _write_paragraphs(path, docs):
  path.write_text("\n\n".join(docs) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  """A 1-step run on text files, and two other eval files: (workdir, eval file, other file)."""
  root = tmp_path_factory.mktemp("rel2_text")
  corpus = sources.embedded_corpus("train")
  train_file = _write_paragraphs(root / "train.txt", corpus[:300])
  eval_file = _write_paragraphs(root / "eval.txt", corpus[300:360])
  other = _write_paragraphs(root / "other.txt", corpus[360:420])
  workdir = str(root / "w")
  config = tiny_config(
    **{
      "data.source": "text",
      "data.paths": train_file,
      "data.eval_paths": eval_file,
      "data.train_split": "train",
      "num_train_steps": 1,
    }
  )
  assert train.train_and_evaluate(config, workdir)["step"] == 1
  return workdir, eval_file, other


def copy_of(workdir, tmp_path, name="w"):
  dst = str(tmp_path / name)
  shutil.copytree(workdir, dst, ignore=shutil.ignore_patterns(".lock"))
  return dst


def harness(script, cases, extra_env=None):
  """Runs argument lists of one launcher in one process (tests/cli_harness.py)."""
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "tests", "cli_harness.py"), os.path.join("launch", script)],
    input=json.dumps(cases),
    capture_output=True,
    text=True,
    cwd=REPO,
    env={**env(), **(extra_env or {})},
    timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout)


def check_cases(script, cases, extra_env=None):
  for (args, expected), result in zip(cases, harness(script, [a for a, _ in cases], extra_env)):
    assert_one_error_line(result, expected, f"{script} {' '.join(args)}")


def error_lines(stderr):
  """The stderr lines of a launcher that are not its own INFO progress lines."""
  return [l for l in stderr.splitlines() if l.strip() and not l.startswith("I1")]


# ----------------------------------------------------------------------------- lost
def test_eval_history_is_keyed_by_data(text_run, tmp_path):
  """A second likelihood eval with other --eval_paths (or the same path, other content) adds
  its own entry; each entry names its data by path and content hash."""
  workdir, eval_file, other = text_run
  out = str(tmp_path / "results.json")
  opts = eval_run.EvalOptions(num_orders=1, max_rows=4, batch_size=4)

  def evaluate(path):
    return eval_run.evaluate_workdir(
      workdir,
      ["likelihood"],
      opts,
      log=None,
      output=out,
      data_overrides={"eval_paths": ("--eval_paths", path)},
    )

  evaluate(eval_file)
  evaluate(other)
  changed = tmp_path / "changed.txt"
  shutil.copy(other, changed)
  evaluate(str(changed))
  with open(changed, "a") as f:
    f.write("\n\nOne more paragraph, so the same name holds other data now.\n")
  evaluate(str(changed))
  record = json.load(open(out))
  assert record["data"]["likelihood"]["files"][0]["path"] == str(changed)  # the latest eval's
  history = record["history"]
  assert len(history) == 4, list(history)
  files = [entry["data"]["files"][0] for entry in history.values()]
  assert [f["path"] for f in files] == [eval_file, other, str(changed), str(changed)]
  assert len({f["sha256"] for f in files}) == 3  # other.txt and the first changed.txt: equal
  assert all(entry["data"]["source"] == "text" for entry in history.values())
  assert files[1]["sha256"] == results_lib.file_identity(other)["sha256"]


# ----------------------------------------------------------------------------- data flags
SOURCE_CONFIGS = {  # one config of each data source (what validate_data_config needs)
  "embedded": {},
  "tfds": {"tfds_name": "lm1b", "train_split": "train", "eval_split": "test"},
  "text": {"paths": "t.txt"},
  "jsonl": {"paths": "t.jsonl"},
  "pairs_jsonl": {"paths": "t.jsonl", "preprocess": "pad"},
  "gsm8k": {"preprocess": "pad"},
  "arithmetic": {"preprocess": "pad"},
  "chain": {"preprocess": "pad"},
}


def _data_config(source):
  c = pipeline.default_data_config()
  c.source = source
  for key, value in SOURCE_CONFIGS[source].items():
    c[key] = value
  return c


def test_every_data_flag_is_used_or_refused_on_every_source(tmp_path):
  """data flag x data source: `launch/evaluate.py --eval_paths / --tfds_data_dir` and the
  training fields data.paths / data.eval_paths / data.tfds_data_dir are set where the source
  reads them and refused (naming the flag) where it would ignore them."""
  assert set(SOURCE_CONFIGS) == set(pipeline.SOURCES)
  text = tmp_path / "v.txt"
  text.write_text("some evaluation text\n")
  values = {"eval_paths": str(text), "paths": str(text), "tfds_data_dir": str(tmp_path)}
  flags = {"eval_paths": "--eval_paths", "tfds_data_dir": "--tfds_data_dir"}
  for source in pipeline.SOURCES:
    for field in ("eval_paths", "tfds_data_dir"):  # evaluate's flags
      c = _data_config(source)
      if source in data_flags.READERS[field]:
        data_flags.apply_overrides(c, {field: (flags[field], values[field])})
        assert c[field] == values[field], (source, field)
      else:
        with pytest.raises(ValueError, match=f"^{flags[field]} is not read by this run") as e:
          data_flags.apply_overrides(c, {field: (flags[field], values[field])})
        assert f"data.source={source}" in str(e.value) and "drop it" in str(e.value)
    for field in ("paths", "eval_paths", "tfds_data_dir"):  # the training config's fields
      c = _data_config(source)
      c[field] = values[field]
      if source in data_flags.READERS[field]:
        data_flags.check_fields(c)
      else:
        with pytest.raises(ValueError, match=f"^data.{field} is not read by this run"):
          pipeline.validate_data_config(c)


@pytest.mark.parametrize("kind", ["missing", "empty", "random bytes", "directory", "NUL bytes"])
def test_unusable_eval_file_is_refused_naming_the_flag(tmp_path, kind):
  path = tmp_path / "data.txt"
  if kind == "empty":
    path.write_text("  \n\n")
  elif kind == "random bytes":
    path.write_bytes(np.random.default_rng(0).integers(128, 256, 4000, dtype=np.uint8).tobytes())
  elif kind == "directory":
    path.mkdir()
  elif kind == "NUL bytes":
    path.write_bytes(b"text\x00\x00\x01binary")
  c = _data_config("text")
  with pytest.raises(ValueError, match=f"^--eval_paths={path}") as e:
    data_flags.apply_overrides(c, {"eval_paths": ("--eval_paths", str(path))})
  assert c.eval_paths == "" and "\n" not in str(e.value)


def test_evaluate_refuses_data_flags_it_would_ignore(run_dir, tmp_path):
  """The regression of the probe: --eval_paths (missing, empty, random bytes, a directory) on an
  embedded-corpus run exited 0 with the embedded split's numbers. Nothing is written."""
  w = f"--workdir={run_dir}"
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  binary = tmp_path / "random.bin"
  binary.write_bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes())
  out = str(tmp_path / "r.json")
  cases = [
    ([w, "--eval=likelihood", f"--eval_paths={p}", f"--output={out}"], ["--eval_paths", "embedded"])
    for p in (tmp_path / "nonexistent.txt", empty, binary, tmp_path)
  ]
  cases += [
    ([w, "--eval=likelihood", f"--tfds_data_dir={tmp_path}"], ["--tfds_data_dir", "embedded"]),
    ([w, "--eval=speed", f"--accuracy_data={empty}"], ["--accuracy_data", "--eval=accuracy"]),
    ([w, "--eval=likelihood", f"--cloze_path={empty}"], ["--cloze_path", "--eval=infill"]),
    ([w, "--eval=speed", f"--judge_workdir={run_dir}"], ["--judge_workdir", "--eval=samples"]),
    ([w, "--eval=accuracy", f"--accuracy_data={empty}"], [f"--accuracy_data={empty} is empty"]),
    ([w, "--eval=accuracy", f"--accuracy_data={binary}"], [f"--accuracy_data={binary}", "UTF-8"]),
    (
      [w, "--eval=speed", "--thresholds=0.9", "--policy_args=0.5"],
      ["--thresholds and --policy_args both set tau"],
    ),
    (
      [w, "--eval=accuracy", "--preset=gsm8k_shell", "--thresholds=0.5"],
      ["--preset=gsm8k_shell sets tau, so --thresholds would be unused"],
    ),
    (
      [w, "--eval=accuracy", "--preset=gsm8k_repro", "--extractor=boxed"],
      ["--preset=gsm8k_repro scores as the reference does (--extractor=gsm8k)"],
    ),
  ]
  check_cases("evaluate.py", cases)
  assert not os.path.exists(out)


def test_evaluate_refuses_flags_no_requested_eval_reads(run_dir, tmp_path):
  """The probe's second round: --window, --thresholds, --num_examples, ... on --eval=likelihood
  exited 0 (and went into the history key as settings); --num_examples=-7 evaluated the first 3
  pairs (a Python slice), --speed_examples=-1 was stored as given. Nothing is written."""
  w = f"--workdir={run_dir}"
  out = str(tmp_path / "r.json")
  lik = [w, "--eval=likelihood", f"--output={out}"]
  cases = [
    (lik + [flag], [flag.split("=")[0].replace("--no", "--"), "only, not by --eval=likelihood"])
    for flag in (
      "--window=8",
      "--thresholds=0.5",
      "--num_examples=3",
      "--speed_examples=2",
      "--top_p=0.5",
      "--repeats=3",
      "--sampling_seed=3",
      "--noalign_to_blocks",
    )
  ]
  cases += [
    ([w, "--eval=speed", "--num_orders=2"], ["--num_orders", "--eval=likelihood only"]),
    ([w, "--eval=samples", "--repetition_penalty=1.2"], ["--repetition_penalty", "infill only"]),
    ([w, "--eval=accuracy", "--num_examples=-7"], ["--num_examples=-7 must be >= 1"]),
    ([w, "--eval=accuracy", "--num_examples=0"], ["--num_examples=0 must be >= 1"]),
    ([w, "--eval=accuracy", "--speed_examples=-1"], ["--speed_examples=-1 must be >= 0"]),
    # probe round 15: -5 evaluated every example (any value below 0 meant -1, "all that fit")
    ([w, "--eval=infill", "--num_infill=-5"], ["--num_infill=-5 must be >= 1 or -1 (all that"]),
    # probe round 16: greedy accuracy decoding drew nothing from it, yet each seed was a new
    # history entry with the same numbers
    (
      [w, "--eval=accuracy", "--sampling_seed=7"],
      ["--sampling_seed=7 changes nothing in --eval=accuracy", "--preset=gsm8k_repro or"],
    ),
    # infill decodes greedily too (test_evaluate.test_decode_infill: the seed changes nothing)
    (
      [w, "--eval=infill,accuracy", "--sampling_seed=7"],
      ["--sampling_seed=7 changes nothing in --eval=accuracy and --eval=infill"],
    ),
    (
      [w, "--eval=infill", "--sampling_seed=7"],
      ["changes nothing in --eval=infill: greedy decoding"],
    ),
  ]
  check_cases("evaluate.py", cases)
  assert not os.path.exists(out)


def test_decoding_settings_the_runs_sampler_cannot_use_are_refused(run_dir):
  """The probe: --window / --threshold on an AR run, --align_to_blocks on a SetDLM run were
  accepted and dropped (the sample header even listed align_to_blocks)."""
  check = decoding.check_method_flags
  with pytest.raises(
    ValueError, match="^--window would be ignored: this ar run's sampler has no set"
  ):
    check(decoders.get("ar"), window=8)
  with pytest.raises(ValueError, match="^--threshold and --policy would be ignored: .* no commit"):
    check(decoders.get("ar"), policy_flags=["threshold", "policy"])
  with pytest.raises(ValueError, match="^--window would be ignored: this bd3lm run's sampler"):
    check(decoders.get("bd3lm"), window=4)
  with pytest.raises(ValueError, match="^--align_to_blocks would be ignored: this setdlm run's"):
    check(decoders.get("setdlm"), align_to_blocks=True)
  for name in ("bd3lm", "mdlm"):
    check(decoders.get(name), policy_flags=["threshold"], align_to_blocks=True)
  check(decoders.get("setdlm"), window=8, policy_flags=["threshold", "policy", "policy_arg"])
  w = f"--workdir={run_dir}"  # a SetDLM run: the launchers' paths
  check_cases(
    "sample.py",
    [([w, "--align_to_blocks"], ["--align_to_blocks would be ignored", "no block grid"])],
  )


def test_a_config_files_own_error_is_its_message_not_a_traceback(tmp_path):
  """ml_collections wraps a config file's exception with its whole traceback; the line was ~650
  characters of flattened frames. Now: the flag and the file's own message."""
  w = f"--workdir={tmp_path / 'w'}"
  cases = [
    (
      ["--config=configs/lm1b_sw.py:bogus", w],
      ["error: --config=configs/lm1b_sw.py:bogus: config variant 'bogus'"],
    ),
    (
      ["--config=configs/reasoning_common.py", w],
      ["--config=configs/reasoning_common.py: TypeError: get_config() missing 1 required"],
    ),
    (["--config=configs/compare.py:setdlm", w], ["needs its set/block size, e.g. setdlm4"]),
  ]
  for (args, expected), result in zip(cases, harness("train.py", [a for a, _ in cases])):
    assert_one_error_line(result, expected, " ".join(args))
    assert "Traceback" not in result["stderr"] and len(result["stderr"]) < 300
  assert not os.path.exists(tmp_path / "w")


def test_sample_wraps_the_prompt_as_the_run_was_trained(run_dir, tmp_path):
  """A run trained on GSM8K-style prompts (data.prompt_style) was sampled with the raw --prompt,
  unlike training and the accuracy eval; now the run's style wraps it (named in the header), and
  --prompt_style=plain passes it as given."""
  from setdiff_jax.data.pairs import GSM8K_INSTRUCTION

  workdir = str(tmp_path / "w")
  shutil.copytree(run_dir, workdir, ignore=shutil.ignore_patterns(".lock"))
  path = os.path.join(workdir, "config.json")
  config = json.load(open(path))
  config["data"]["prompt_style"] = "gsm8k"
  json.dump(config, open(path, "w"))
  common = dict(prompt="Two apples", max_new_tokens=1, greedy=True, num_samples=1, batch_size=1)
  for style, starts in ((None, GSM8K_INSTRUCTION + "Two apples"), ("plain", "Two apples")):
    lines = []
    decoding.sample_from_workdir(workdir, prompt_style=style, write=lines.append, **common)
    assert ("prompt_style: gsm8k" in lines[0]) == (style is None), lines[0]
    sample = lines[1].split("\n", 1)[1]
    assert sample.startswith(starts), (style, sample)
  with pytest.raises(ValueError, match="--prompt_style wraps --prompt, which is not given"):
    decoding.sample_from_workdir(workdir, prompt_style="plain", write=print, num_samples=1)


def test_an_export_given_as_a_run_is_named_as_such(tmp_path):
  """An export directory passed as --workdir read as a damaged run ("the run's tokenizer was
  deleted", "no checkpoint: train first"); now one line saying what it is and how to load it."""
  export = tmp_path / "export"
  export.mkdir()
  (export / "config.json").write_text(json.dumps({"model_type": "setdlm"}))
  (export / "model.safetensors").write_bytes(b"")
  w = f"--workdir={export}"
  want = [
    f"{export} is an exported or Hugging Face checkpoint (model.safetensors",
    "import_checkpoint",
  ]
  check_cases("sample.py", [([w], want)])
  check_cases("evaluate.py", [([w], want)])
  check_cases("export.py", [([w, f"--out={tmp_path / 'again'}"], want)])
  assert sorted(os.listdir(export)) == ["config.json", "model.safetensors"]


# ----------------------------------------------------------------------------- what was used
def test_sampler_header_names_the_tau_the_sampler_reads(run_dir):
  """tau given as --threshold, as --policy_arg of the threshold policy, or both (equal): the
  header says the value the sampler commits with (`CommitPolicy.param`); it said tau=off for
  --policy_arg alone."""
  state = workdir_lib.load_inference_state(run_dir)
  oc = state.objective_config
  method = decoders.get(oc.name)
  ways = {
    "--threshold": dict(threshold=0.5),
    "--policy_arg": dict(policy_arg=0.5),
    "--threshold and --policy_arg": dict(threshold=0.5, policy_arg=0.5),
  }
  for way, kwargs in ways.items():
    cfg = decoding.sampler_config_for(oc, state.tokenizer, 64, **kwargs)
    assert cfg.policy == CommitPolicy("threshold", 0.5), way
    header = decoding.sampler_settings(method, oc, cfg)
    assert "tau=0.5" in header and "tau=off" not in header, (way, header)
  cfg = decoding.sampler_config_for(oc, state.tokenizer, 64)
  assert "tau=off" in decoding.sampler_settings(method, oc, cfg)


def test_evaluate_policy_args_of_the_threshold_policy_are_its_tau(run_dir):
  """`--policy_args` with the default policy used to be dropped without a word; the library
  refuses it (the launcher passes them as --thresholds, checked in the slow test below)."""
  state = workdir_lib.load_inference_state(run_dir)
  settings = generation.decoding_settings(state.objective_config, thresholds=[None])
  with pytest.raises(ValueError, match="--policy_args sets tau of --policy=threshold"):
    generation.with_policy(state.objective_config, settings, policies.DEFAULT, (0.5,))
  assert generation.with_policy(state.objective_config, settings, policies.DEFAULT) == settings


@pytest.mark.slow
def test_evaluate_record_names_the_tau_used(run_dir, tmp_path):
  out = str(tmp_path / "r.json")
  base = [
    f"--workdir={run_dir}",
    "--eval=speed",
    "--batch_sizes=1",
    "--repeats=1",
    "--max_new_tokens=2",
    f"--output={out}",
  ]
  for way in (["--thresholds=0.5"], ["--policy_args=0.5"]):
    (result,) = harness("evaluate.py", [base + way])
    assert result["rc"] == 0, result["stderr"][-2000:]
    rows = json.load(open(out))["speed"]
    assert [r["threshold"] for r in rows] == ["0.5"], (way, rows)
    assert "tau=0.5" in result["stdout"], way


# ----------------------------------------------------------------------------- ranges
# launcher -> {flag: field}: every launcher's flags that take a field of the shared table.
LAUNCHER_FLAGS = {
  "sample.py": {
    "step": "step",
    "seed": "seed",
    "num_samples": "num_samples",
    "batch_size": "batch_size",
    "threshold": "threshold",
    "top_p": "top_p",
    "temperature": "temperature",
    "repetition_penalty": "repetition_penalty",
  },
  "evaluate.py": {
    "step": "step",
    "seed": "seed",
    "sampling_seed": "seed",
    "batch_size": "batch_size",
    "batch_sizes": "batch_size",
    "num_samples": "num_samples",
    "top_p": "top_p",
    "repetition_penalty": "repetition_penalty",
  },
  "export.py": {"step": "step"},
}
CONFIG_FIELDS = {  # the RL and training configs' fields of the shared table
  "rl.py": {
    "rl.top_p": "top_p",
    "rl.temperature": "temperature",
    "rl.repetition_penalty": "repetition_penalty",
    "rl.window": "window",
    "rl.max_new_tokens": "max_new_tokens",
    "seed": "seed",
  },
  "train.py": {"seed": "seed", "batch_size": "batch_size"},
}


def _outside(allowed):
  """Values just outside a range (below it, above it where bounded)."""
  below = allowed.lo - (1 if allowed.kind is int else 0.5) if allowed.lo is not None else None
  if allowed.lo_open:
    below = allowed.lo
  out = [below] if below is not None and below not in allowed.also else []
  if allowed.hi is not None:
    out.append(allowed.hi + 1 if allowed.kind is int else allowed.hi + 0.5)
  return [v for v in out if v is not None and not allowed.ok(v)]


def test_every_launcher_enforces_the_shared_range_of_a_field(run_dir, tmp_path):
  """launcher x field: a value outside ranges.SHARED is refused by every launcher taking the
  field, each line naming the flag and the same allowed range."""
  w = f"--workdir={run_dir}"
  for script, flag_fields in LAUNCHER_FLAGS.items():
    cases = []
    for flag, field in flag_fields.items():
      allowed = ranges.SHARED[field]
      extra = [f"--out={tmp_path / 'export'}"] if script == "export.py" else []
      for v in _outside(allowed):
        if script == "sample.py" and flag == "seed" and v == -1:
          continue  # sample's own -1: a random seed
        text = f"{int(v)}" if allowed.kind is int else f"{v:g}"
        cases.append(
          ([w, f"--{flag}={text}"] + extra, [f"--{flag}=", f"allowed: {allowed.describe()}"])
        )
    check_cases(script, cases)
  sft = f"--config.rl.init_from={run_dir}"
  for script, fields in CONFIG_FIELDS.items():
    cases = []
    for name, field in fields.items():
      allowed = ranges.SHARED[field]
      if name.startswith("rl.") and field in ("window", "max_new_tokens"):
        allowed = allowed.with_also(0)  # the RL config's 0: the default
      for v in _outside(allowed):
        text = f"{int(v)}" if allowed.kind is int else f"{v:g}"
        if script == "rl.py":
          args = [
            "--config=" + os.path.join(REPO, "configs", "rl_arithmetic.py"),
            f"--workdir={tmp_path / 'rl'}",
            sft,
            f"--config.{name}={text}",
          ]
        else:
          args = tiny_args(str(tmp_path / "t"), **{name: text})
        cases.append((args, [f"{name}=", f"allowed: {allowed.describe()}"]))
    check_cases(script, cases)
  assert not os.path.exists(tmp_path / "export") and not os.path.exists(tmp_path / "t")


def test_the_libraries_accept_what_the_table_accepts():
  """Every library check behind a launcher agrees with ranges.SHARED on values around the
  bounds (so a value one launcher takes is not refused by another's library)."""
  # 1e-4 / 5e-5: temperature's lower bound (below it the jitted softmax of z / T overflowed and
  # a real run drew PAD everywhere); inf: an unbounded side is still finite
  probes = [-1.0, 0.0, 1e-6, 5e-5, 1e-4, 0.5, 1.0, 1.5, 1e300, float("nan"), float("inf")]
  base = dict(mask_token_id=4)

  def accepts(fn):
    try:
      fn()
      return True
    except ValueError:
      return False

  checks = {
    "threshold": [
      lambda v: commit_policy(threshold=v),
      lambda v: SamplerConfig(**base, policy=CommitPolicy("threshold", v)),
      lambda v: policies.check_arg("threshold", v),
      lambda v: policies.check_arg("pmax", v),
      lambda v: generation.parse_thresholds([str(v)]),
    ],
    "top_p": [lambda v: SamplerConfig(**base, top_p=v)],
    "temperature": [lambda v: SamplerConfig(**base, temperature=v)],
    "repetition_penalty": [lambda v: SamplerConfig(**base, repetition_penalty=v)],
  }
  for field, fns in checks.items():
    for v in probes:
      want = ranges.SHARED[field].ok(v)
      for fn in fns:
        assert accepts(lambda: fn(v)) == want, (field, v)


# ----------------------------------------------------------------------------- unclear -> one line
def test_unclear_cases_are_one_line(run_dir, tmp_path):
  """Each was a traceback, a bare errno or advice that named no path (8dbf799); also the URL
  schemes and a flag --greedy would leave unused."""
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  check_cases(
    "train.py",
    [
      (tiny_args(str(a_file)), [f"--workdir={a_file} is a regular file", "pass a directory"]),
      (tiny_args(str(a_file / "run")), [f"inside {a_file}, which is a regular file"]),
      # URL schemes the path layer does not support (file:// is a local path: slow test below)
      (tiny_args("http://example.com/run"), ["--workdir=http://example.com/run", "http://"]),
    ],
  )
  empty_json = copy_of(run_dir, tmp_path, "empty_json")
  special = os.path.join(empty_json, "tokenizer", "special_tokens.json")
  open(special, "w").write("{}")
  emptied = copy_of(run_dir, tmp_path, "emptied")
  open(os.path.join(emptied, "tokenizer", "special_tokens.json"), "w").close()
  no_tok = copy_of(run_dir, tmp_path, "no_tok")
  shutil.rmtree(os.path.join(no_tok, "tokenizer"))
  check_cases(
    "sample.py",
    [
      ([f"--workdir={empty_json}"], [special, "damaged (no kind", "copy the tokenizer/"]),
      ([f"--workdir={emptied}"], ["special_tokens.json is damaged"]),
      ([f"--workdir={no_tok}"], [os.path.join(no_tok, "tokenizer"), "copy the run's tokenizer/"]),
      (
        [f"--workdir={run_dir}", "--greedy", "--temperature=0.5"],
        ["--temperature would be unused"],
      ),
      ([f"--workdir=s3://bucket{run_dir}"], ["--workdir=s3://bucket", "s3:// scheme is not"]),
      (["--workdir=GS://bucket/run"], ["GS://bucket/run", "lower case, gs://bucket/run"]),
      (["--workdir=file://host/x"], ["file://host/x", "host 'host'"]),
    ],
  )
  rl = ["--config=" + os.path.join(REPO, "configs", "rl_arithmetic.py")]
  check_cases(
    "rl.py",
    [
      (
        rl + [f"--workdir={run_dir}", f"--config.rl.init_from={run_dir}"],
        ["is the run's own --config.rl.init_from", "pass a new --workdir"],
      ),
    ],
  )
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "launch", "local_cluster.py"), "--", "no_such_command_x"],
    capture_output=True,
    text=True,
    env=env(),
    timeout=120,
  )
  assert_one_error_line(
    {"rc": r.returncode, "stderr": r.stderr}, ["'no_such_command_x'", "not an executable"], "lc"
  )


def test_init_from_with_no_intact_checkpoint_says_so(run_dir, tmp_path):
  """RL (or --config.init_from) from a run whose checkpoints are all damaged: the message is
  about that run, not advice to train the current workdir elsewhere."""
  from test_reliability import _truncate_data_files

  sft = copy_of(run_dir, tmp_path, "sft")
  for step in (1, 2):
    _truncate_data_files(os.path.join(sft, "checkpoints", str(step)))
  like = workdir_lib.load_inference_state(run_dir).params
  with pytest.raises(errors.DamagedCheckpointError) as e:
    workdir_lib.load_params(sft, like)
  msg = str(e.value)
  assert f"init_from='{sft}', the run this one starts from, has no intact checkpoint" in msg
  assert "restore that run's checkpoints/" in msg and "Train into another" not in msg


def _export(run_dir, tmp_path):
  from setdiff_jax.interop import export_workdir

  out = str(tmp_path / "hf")
  export_workdir(run_dir, out)
  return out, os.path.join(out, "model.safetensors")


def test_import_refuses_nonfinite_or_integer_weights_naming_the_tensor(run_dir, tmp_path):
  from safetensors.numpy import load_file, save_file

  from setdiff_jax.interop import import_checkpoint

  out, file = _export(run_dir, tmp_path)
  state = load_file(file)
  key = sorted(state)[len(state) // 2]
  cases = {
    "NaN": (lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a), "1 NaN"),
    "Inf": (lambda a: np.full_like(a, np.inf), "Inf values"),
    "int32": (lambda a: a.astype(np.int32), "is int32, not floating point"),
  }
  for what, (change, expected) in cases.items():
    damaged = dict(state, **{key: np.ascontiguousarray(change(state[key]))})
    save_file(damaged, file, metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
      import_checkpoint(out)
    assert f"{file}: tensor {key!r}" in str(e.value) and expected in str(e.value), what


# ----------------------------------------------------------------------------- storage and disk
def test_unreachable_object_store_is_one_line_in_bounded_time(run_dir, tmp_path):
  """gs:// with no reachable endpoint (the GCS emulator's variables, pointed at a closed local
  port; no network): one line naming the path and the flag, in seconds, gcsfs's retries and
  tracebacks quiet."""
  pytest.importorskip("gcsfs")
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed again: nothing listens there
  url = f"http://127.0.0.1:{port}"
  store = {
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "none",
  }
  cases = [
    (
      tiny_args("gs://bucket/run"),
      ["error: --workdir=gs://bucket/run: cannot reach the object store after"],
    ),
    (
      tiny_args(str(tmp_path / "t"), **{"init_from": "gs://other/run"}),
      ["--config.init_from=gs://other/run", "credentials"],
    ),
  ]
  t0 = time.monotonic()
  check_cases("train.py", cases, store)
  check_cases(
    "export.py",
    [([f"--workdir={run_dir}", "--out=gs://bucket/export"], ["--out=gs://bucket/export"])],
    store,
  )
  assert time.monotonic() - t0 < 120


@pytest.mark.slow
def test_file_url_workdir_and_out_are_local_paths(run_dir, tmp_path):
  out = tmp_path / "exported"
  r = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "launch", "export.py"),
      f"--workdir=file://{run_dir}",
      f"--out=file://{out}",
    ],
    capture_output=True,
    text=True,
    cwd=str(tmp_path),
    env=env(),
    timeout=300,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert os.path.isfile(out / "model.safetensors") and not os.path.exists(tmp_path / "file:")


class _FullManager:
  """A checkpoint manager whose save fails the way tensorstore reports a write limit."""

  directory = "/runs/w/checkpoints"

  def __init__(self, text):
    self.text = text

  def save(self, *args, **kwargs):
    raise ValueError(self.text)

  def all_steps(self):
    return [1, 2]


@pytest.mark.parametrize(
  "text,what",
  [
    ("OUT_OF_RANGE: Failed to write 298965 bytes: File too large [os_error_code='27']", "file too"),
    ("RESOURCE_EXHAUSTED: Failed writing: No space left on device", "disk full"),
  ],
)
def test_every_checkpoint_save_names_what_is_intact(text, what):
  """`checkpoints.save` is the one save of training and RL: ENOSPC and EFBIG become one line."""
  with pytest.raises(errors.DiskFullError) as e:
    checkpointing.save(_FullManager(text), 3, {"x": np.zeros(2)})
  stream = io.StringIO()
  assert cli.report(e.value, stream) == 1
  (line,) = stream.getvalue().splitlines()
  assert line.startswith(f"error: {what}") and "while saving checkpoint 3" in line
  assert "the previous checkpoint (step 2) is intact" in line


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EFBIG])
def test_results_file_write_failure_says_what_is_kept(tmp_path, monkeypatch, code):
  """An unwritable results file with no usable temporary directory either: one line, the earlier
  results named intact, no "No usable temporary directory" riddle."""
  from setdiff_jax import paths

  out = tmp_path / "r.json"
  out.write_text('{"earlier": 1}')

  def fail(*args, **kwargs):
    raise OSError(code, os.strerror(code))

  monkeypatch.setattr(paths, "write_text", fail)
  monkeypatch.setattr(results_lib.tempfile, "mkstemp", fail)
  with pytest.raises(errors.DiskFullError) as e:
    results_lib.write_results({"likelihood": {}}, str(out))
  stream = io.StringIO()
  cli.report(e.value, stream)
  (line,) = stream.getvalue().splitlines()
  assert f"could not write the evaluation results to {out}" in line
  assert "earlier results there are intact" in line and "no copy could be kept" in line
  assert json.load(open(out)) == {"earlier": 1}


LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process (kept by exec)
n = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
os.execv(sys.executable, [sys.executable] + sys.argv[2:])
"""


def _limited(nbytes):
  """The command prefix that runs a command under a file size limit (no fork in this process:
  jax is multithreaded)."""
  return [sys.executable, "-c", LIMITED, str(nbytes)]


@pytest.mark.slow
def test_file_size_limit_during_training_and_export_saves(run_dir, tmp_path):
  """EFBIG (RLIMIT_FSIZE in the launcher's process): training's save and the export each end
  with one error line saying what is intact; the libraries' tracebacks go to WORKDIR/logs."""
  workdir = copy_of(run_dir, tmp_path)
  r = subprocess.run(
    _limited(100_000)
    + [os.path.join(REPO, "launch", "train.py")]
    + tiny_args(workdir, num_train_steps=3),
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
    timeout=600,
  )
  lines = error_lines(r.stderr)
  assert r.returncode == 1 and len(lines) <= 3, "\n".join(lines[-20:])
  assert lines[-1].startswith("error: file too large (EFBIG") and "checkpoint 3" in lines[-1]
  assert "the previous checkpoint (step 2) is intact" in lines[-1]
  assert "Traceback" not in r.stderr
  log = lines[-1].split("library details: ")[1].rstrip(")")
  assert log.startswith(os.path.join(workdir, "logs")) and "File too large" in open(log).read()
  assert workdir_lib.load_inference_state(workdir).step == 2
  out = tmp_path / "export"
  r = subprocess.run(
    _limited(60_000)
    + [os.path.join(REPO, "launch", "export.py"), f"--workdir={workdir}"]
    + [f"--out={out}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
    timeout=600,
  )
  lines = error_lines(r.stderr)
  assert r.returncode == 1 and len(lines) <= 3, "\n".join(lines[-20:])
  assert lines[-1].startswith("error: file too large") and f"exporting to {out}" in lines[-1]
  assert f"the run {workdir} is intact" in lines[-1]


DISK_FULL = """
import errno, os, runpy, sys
from etils import epath
real = epath.Path.write_text
def full(self, *args, **kwargs):
  if os.sep + "checkpoints" + os.sep in str(self):
    raise OSError(errno.ENOSPC, "No space left on device", str(self))
  return real(self, *args, **kwargs)
epath.Path.write_text = full
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_disk_full_during_a_training_save_is_one_line(run_dir, tmp_path):
  workdir = copy_of(run_dir, tmp_path)
  r = subprocess.run(
    [sys.executable, "-c", DISK_FULL, os.path.join(REPO, "launch", "train.py")]
    + tiny_args(workdir, num_train_steps=3),
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
    timeout=600,
  )
  lines = [l for l in error_lines(r.stderr) if "with changed settings: num_train_steps" not in l]
  assert r.returncode == 1 and len(lines) <= 3, "\n".join(lines[-20:])  # (the resume's warning)
  assert lines[-1].startswith("error: disk full while saving checkpoint 3")
  assert "the previous checkpoint (step 2) is intact" in lines[-1] and "Traceback" not in r.stderr


EDGE = """
import sys
from setdiff_jax import cli
failure = type("Failure", (Exception,), {"__module__": sys.argv[1]})
def main(argv):
  raise failure("NOT_FOUND: Error reading local file: gone")
sys.exit(cli.call(main, ["prog"]))
"""


def test_storage_library_errors_are_caught_at_the_launcher_edge():
  """An exception raised by orbax / tensorstore / gcsfs itself is one line (not a traceback);
  one of another module stays a traceback (a bug)."""
  for module in ("tensorstore", "orbax.checkpoint", "gcsfs.retry"):
    r = subprocess.run(
      [sys.executable, "-c", EDGE, module], capture_output=True, text=True, env=env(), timeout=120
    )
    assert (r.returncode, r.stderr) == (1, "error: NOT_FOUND: Error reading local file: gone\n")
  r = subprocess.run(
    [sys.executable, "-c", EDGE, "mine"], capture_output=True, text=True, env=env(), timeout=120
  )
  assert r.returncode == 1 and "Traceback" in r.stderr


MID_RUN = """
from absl import flags
from setdiff_jax import cli
flags.DEFINE_string("workdir", None, "")
cli.FLAGS(["prog", "--workdir=gs://bucket/run"])
print(cli.describe(OSError(111, "Cannot connect to host 127.0.0.1:9 ssl:default")))
"""


def test_store_lost_during_a_run_names_the_path_and_flag():
  """After the probe passed (the store went away mid-run): still the path and the flag."""
  r = subprocess.run(
    [sys.executable, "-c", MID_RUN], capture_output=True, text=True, env=env(), timeout=120
  )
  assert r.stdout.startswith("cannot reach the object store of --workdir=gs://bucket/run"), r
  assert "credentials" in r.stdout and r.stdout.count("\n") == 1


def test_an_empty_path_flag_is_refused(run_dir, tmp_path):
  """`--workdir=$RUN` with RUN unset: training would write the run into the current directory,
  the other launchers would read it as the run. Every path flag refuses an empty value."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "launch", "train.py")] + tiny_args(""),
    cwd=cwd,
    capture_output=True,
    text=True,
    env=env(),
    timeout=300,
  )
  result = {"rc": r.returncode, "stderr": r.stderr}
  assert_one_error_line(result, ["--workdir is empty", "unset shell variable"], "train --workdir=")
  assert os.listdir(cwd) == []  # nothing written where it ran
  w = f"--workdir={run_dir}"
  cases = {
    "sample.py": [["--workdir="]],
    "evaluate.py": [["--workdir="], [w, "--output="], [w, "--eval=accuracy", "--accuracy_data="]],
    "export.py": [["--workdir=", f"--out={tmp_path / 'e'}"], [w, "--out="]],
  }
  for script, argvs in cases.items():
    for args, result in zip(argvs, harness(script, argvs)):
      flag = next(a for a in args if a.endswith("="))
      assert_one_error_line(result, [f"{flag[:-1]} is empty"], f"{script} {' '.join(args)}")
  assert not os.path.exists(tmp_path / "e")
  with pytest.raises(ValueError, match="--workdir is empty"):
    train.train_and_evaluate(tiny_config(), " ")


def test_ctrl_c_outside_the_training_loop_is_one_stopped_line(tmp_path):
  """Ctrl-C while a launcher compiles (before the training loop's own handler) printed a
  KeyboardInterrupt traceback, once followed by a segfault at interpreter shutdown. Now: one
  `stopped:` line, exit status 130 (128 + SIGINT), nothing written into the workdir."""
  script = tmp_path / "interrupted.py"
  script.write_text(
    "import runpy, sys\n"
    "from setdiff_jax import train\n"
    "def interrupted(config, workdir):\n"
    "  raise KeyboardInterrupt\n"
    "train.train_and_evaluate = interrupted\n"
    f"sys.argv = ['train.py', '--config={REPO}/configs/tiny_sw.py', '--workdir={tmp_path}/w']\n"
    f"runpy.run_path('{REPO}/launch/train.py', run_name='__main__')\n"
  )
  r = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env=env(), timeout=300
  )
  assert r.returncode == 130, r.stderr[-2000:]
  assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert lines[-1].startswith("stopped: interrupted by Ctrl-C"), lines
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def _launch_train_patched(tmp_path, body: str, args):
  """Runs launch/train.py as __main__ with train.train_and_evaluate replaced by `body`'s
  `patched(config, workdir, real)`; returns the CompletedProcess."""
  script = tmp_path / "patched.py"
  script.write_text(
    "import os, runpy, signal, sys, time\n"
    "from setdiff_jax import train\n"
    f"{body}\n"
    "real = train.train_and_evaluate\n"
    "train.train_and_evaluate = lambda config, workdir: patched(config, workdir, real)\n"
    f"sys.argv = ['train.py'] + {list(args)!r}\n"
    f"runpy.run_path('{REPO}/launch/train.py', run_name='__main__')\n"
  )
  return subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, env=env(), timeout=600
  )


def test_sigterm_before_the_training_loop_is_one_stopped_line(tmp_path):
  """Probe round 16: SIGTERM before the loop's handler (while a launcher compiles) ended the
  process with status 143 and no line at all (Ctrl-C printed one)."""
  body = (
    "def patched(config, workdir, real):\n"
    "  os.kill(os.getpid(), signal.SIGTERM)\n"
    "  time.sleep(60)\n"
  )
  r = _launch_train_patched(tmp_path, body, tiny_args(tmp_path / "w"))
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert r.returncode == 143, r.stderr[-2000:]
  assert lines[-1].startswith("stopped: terminated by SIGTERM; files written before are intact")
  assert "Traceback" not in r.stderr


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_a_launcher_imports_is_one_stopped_line(sig, code):
  """Probe round 16: Ctrl-C while launch/train.py imported its modules ended in a traceback (or
  an abort, status 134); SIGTERM there ended it without a word. Before the launcher's main runs
  nothing is written: it exits at once with the line."""
  script = (
    "import os, signal, time\n"
    "from setdiff_jax import cli_signals\n"
    "cli_signals.catch_startup_signals()\n"
    f"os.kill(os.getpid(), signal.{sig})\n"
    "time.sleep(60)\n"
    "print('not stopped')\n"
  )
  r = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env(), timeout=120
  )
  assert r.returncode == code and "not stopped" not in r.stdout, r.stderr[-2000:]
  assert r.stderr.splitlines() == [cli_signals.stopped_line(getattr(signal, sig))]


def test_a_signal_a_library_swallowed_still_stops_the_run(tmp_path):
  """Probe round 16: Ctrl-C while jax loads raised KeyboardInterrupt inside jax's garbage-collection
  callback, which Python drops ('Exception ignored'): the run trained to its end and exited 0.
  The launcher remembers the signal; the loop saves at its first step and stops."""
  body = (
    "def patched(config, workdir, real):\n"
    "  try:\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    time.sleep(60)\n"
    "  except KeyboardInterrupt:\n"
    "    pass  # what a library's callback does with it\n"
    "  return real(config, workdir)\n"
  )
  workdir = tmp_path / "w"
  r = _launch_train_patched(tmp_path, body, tiny_args(workdir, num_train_steps=4))
  lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
  assert r.returncode == 130, r.stderr[-2000:]
  assert lines[-1].startswith("stopped: SIGINT at step 1/4; checkpoint "), lines[-1]
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]


def test_a_signal_while_the_flags_are_parsed_is_one_stopped_line(tmp_path):
  """A signal while absl parsed the flags (which runs the --config file's get_config) unwound as
  a StartupSignal traceback through absl, status 1."""
  config = tmp_path / "slow_config.py"
  config.write_text(
    "import os, signal, time\n"
    "from configs import tiny_sw\n"
    "def get_config():\n"
    "  os.kill(os.getpid(), signal.SIGTERM)\n"
    "  time.sleep(60)\n"
    "  return tiny_sw.get_config()\n"
  )
  r = subprocess.run(
    [sys.executable, "launch/train.py", f"--config={config}", f"--workdir={tmp_path / 'w'}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
    timeout=300,
  )
  assert r.returncode == 143, r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert r.stderr.splitlines()[-1] == cli_signals.stopped_line(signal.SIGTERM)
  assert not os.path.exists(tmp_path / "w")
