"""Nothing lost, nothing silently wrong (issue 23): checkpoint retention, the divergence guard,
field ranges, provenance of a workdir, and the remaining one-line errors.

One tiny run (steps 1 and 2 saved) is trained once in-process; each test works on a copy. Bad
command lines go through tests/cli_harness.py (one process per launcher), each asserting the exit
status, that the last stderr line is the `error:` line and how many stderr lines there are.
"""

import hashlib
import json
import logging
import os
import shutil

import pytest

from setdiff_jax import errors, train
from setdiff_jax.data import data_flags, pipeline
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config
from setdiff_jax.config import sections
from setdiff_jax.config.sections import Divergence
from setdiff_jax.workdir import divergence
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir import lock as workdir_lock

from test_reliability import (
  REPO,
  _garbage_inside_data_file,
  assert_one_error_line,
  harness,
  tiny_args,
  tiny_config,
)

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """A 2-step run (checkpoints 1 and 2, log every step), trained in-process."""
  workdir = str(tmp_path_factory.mktemp("safety") / "w")
  result = train.train_and_evaluate(tiny_config(), workdir)
  assert result["step"] == 2
  return workdir


def copy_of(base, tmp_path, name="w"):
  dst = str(tmp_path / name)
  shutil.copytree(base, dst, ignore=shutil.ignore_patterns(".lock"))
  return dst


def listing(workdir):
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


# ----------------------------------------------------------------------------- retention
@pytest.mark.slow
def test_keep_one_resume_past_damage_keeps_a_loadable_checkpoint(base, tmp_path):
  """keep_checkpoints=1 on a resume whose latest step is damaged: the damage is named, the run
  resumes from step 1, and at every save the newest verified step survives the rotation."""
  workdir = copy_of(base, tmp_path)
  _garbage_inside_data_file(os.path.join(workdir, "checkpoints", "2"))
  config = checkpointing.load_config(workdir)
  config.keep_checkpoints = 1
  config.num_train_steps = 3
  result = train.train_and_evaluate(config, workdir)
  assert result["step"] == 3
  # keep 1, plus step 2: the newest whose loss was seen healthy (step 3's loss is not known yet)
  assert listing(workdir) == ["2", "2.damaged", "3"]
  assert workdir_lib.load_inference_state(workdir).step == 3
  assert workdir_lib.load_inference_state(base, step=1).step == 1  # the original still loads


def test_rotation_never_deletes_the_protected_steps(base, tmp_path):
  workdir = copy_of(base, tmp_path)
  manager = checkpointing.make_manager(workdir)
  try:
    checkpointing.rotate(manager, 1, protect=(2, 1))
    assert sorted(manager.all_steps()) == [1, 2]
    checkpointing.rotate(manager, 1, protect=(2,))
    assert sorted(manager.all_steps()) == [2]
  finally:
    checkpointing.close(manager)
  with pytest.raises(ValueError, match=r"keep_checkpoints=0 is out of range"):
    checkpointing.make_manager(workdir, keep=0)


def test_checksums_name_the_damaged_file(base, tmp_path):
  workdir = copy_of(base, tmp_path)
  step_dir = os.path.join(workdir, "checkpoints", "2")
  sums = json.load(open(os.path.join(step_dir, fallback.CHECKSUM_FILE)))
  data_files = [
    f for f in sums if f.startswith("data" + os.sep) and f.endswith(".json") and "commit" not in f
  ]
  assert any(f.startswith("state" + os.sep) for f in sums) and data_files, sorted(sums)
  fallback.verify_checksums(step_dir, 2)  # intact
  victim = os.path.join(step_dir, data_files[0])
  text = open(victim).read()
  open(victim, "w").write(text.replace("0", "1", 1) if "0" in text else text + " ")
  with pytest.raises(errors.DamagedCheckpointError, match=os.path.basename(victim)):
    fallback.verify_checksums(step_dir, 2)
  fallback.verify_checksums(step_dir, 2, with_data=False)  # inference does not read it


# ----------------------------------------------------------------------------- divergence
def test_divergence_guard_unit():
  config = Divergence(factor=10.0, patience=2, window=3)
  guard = divergence.DivergenceGuard(config, history=[5.0, 6.0, 4.0, 100.0])  # window: 6, 4, 100
  assert guard.check(1, 50.0) and list(guard.recent) == [4.0, 100.0, 50.0]
  assert not guard.check(2, 600.0) and guard.suspicious  # > 10 x median 50
  assert guard.check(3, 60.0) and not guard.suspicious  # recovered: the count restarts
  assert not guard.check(4, 601.0)
  with pytest.raises(errors.DivergenceError, match=r"diverged at step 5: loss 700 .*KEPT"):
    guard.check(5, 700.0, lambda: "KEPT")
  learnt = divergence.DivergenceGuard(
    config, history=[0.001] * 5
  )  # a near-zero loss: noise is fine
  assert learnt.check(1, 0.05) and learnt.check(2, 9.0) and not learnt.check(3, 10.5)
  off = divergence.DivergenceGuard(Divergence(factor=0, ceiling=0), [1.0])
  assert all(off.check(i, 1e30) for i in range(5))
  ceiling = divergence.DivergenceGuard(Divergence(ceiling=7.0, patience=1))
  with pytest.raises(errors.DivergenceError, match="divergence_ceiling=7"):
    ceiling.check(1, 8.0)


@pytest.mark.slow
def test_divergence_stops_a_resume_before_it_saves(base, tmp_path):
  """learning_rate=1e3 on a resume from step 2 (keep 1, a checkpoint every step): one error line,
  step 2 (whose loss was seen healthy) kept and loading, the later save set aside."""
  workdir = copy_of(base, tmp_path)
  args = tiny_args(
    workdir, num_train_steps=30, learning_rate=1000.0, keep_checkpoints=1, eval_every_steps=30
  )
  result = harness("train.py", [args])[0]
  lines = [l for l in result["stderr"].splitlines() if l.strip()]
  assert result["rc"] == 1, result
  assert "with changed settings: " in lines[0] and "learning_rate: " in lines[0], lines
  lines = lines[1:]  # the resume's warning naming the new rate, then:
  assert len(lines) == 3, lines  # two warnings (1 of 3, 2 of 3), then the error line
  assert all("above the divergence threshold" in l for l in lines[:2]), lines
  assert_one_error_line(
    dict(result, stderr=lines[-1]),
    [
      "training diverged at step 6",
      "checkpoint step 2",
      "step(s) [3]",
      ".diverged",
      "--config.divergence_factor=0",
    ],
    "lr=1e3",
  )
  steps = workdir_lock.saved_steps(workdir)
  assert steps == [2] and listing(workdir) == ["2", "3.diverged"], listing(workdir)
  assert workdir_lib.load_inference_state(workdir).step == 2


# ----------------------------------------------------------------------------- field ranges
def test_every_field_has_a_declared_range():
  names = set()

  def walk(node, prefix=""):
    for k in node.keys():
      v = node[k]
      if hasattr(v, "keys") and hasattr(v, "to_dict"):
        walk(v, f"{prefix}{k}.")
      else:
        names.add(f"{prefix}{k}")

  walk(run_config.default_config())
  data_checked = {f"data.{k}" for k in run_config.default_config().data.keys()}  # pipeline's
  typed = (run_config.Basics, *sections.SECTIONS)
  ranged = {k for cls in typed for k in cls.ranges()} | set(sections.DATA_RANGES)
  free = {k for cls in typed for k in cls.free_fields()} | set(sections.DATA_FREE_FIELDS)
  assert free == {
    "init_from",
    "init_from_hf",
    "sharding_rules",
    "model.remat",
    "objective",  # a name of the method registry (edge.OBJECTIVES)
    "tokenizer.vocab_path",
    "tokenizer.merges_path",
  }
  undeclared = names - ranged - free - data_checked
  assert not undeclared, undeclared
  assert not (ranged | free) - names
  run_config.check_field_ranges(run_config.default_config())  # the defaults are in range
  edge.from_config_dict(run_config.default_config(), num_devices=1)


def test_shipped_configs_are_in_range():
  import importlib

  for name in sorted(os.listdir(os.path.join(REPO, "configs"))):
    if (
      not name.endswith(".py")
      or name.startswith("_")
      or name in ("compare.py", "reasoning_common.py")
    ):
      continue
    config = importlib.import_module(f"configs.{name[:-3]}").get_config()
    if "model" in config and config.model.hidden_size == 0:  # gsm8k Qwen3: init_from_hf needed
      config.init_from_hf = "/qwen3"
    run_config.check_field_ranges(config)
  from configs import compare

  for method in ("ar", "mdlm", "bd3lm4", "setdlm4"):
    run_config.check_field_ranges(compare.get_config(method))


def test_lm1b_cpu_variants_are_the_recipe_on_the_embedded_corpus():
  """`--config=configs/lm1b_*.py:cpu` (issue 37): the recipe's model, objective, tokenizer and
  preprocessing on the embedded corpus with its own splits, valid as a whole run config."""
  import importlib

  from setdiff_jax.data import pipeline

  for name in ("lm1b_sw", "lm1b_ar", "lm1b_mdlm", "lm1b_bd3lm"):
    module = importlib.import_module(f"configs.{name}")
    recipe, cpu = module.get_config(), module.get_config("cpu")
    for part in ("model", "loss", "tokenizer"):
      a, b = recipe[part].to_dict(), cpu[part].to_dict()
      if part == "model":
        assert (a.pop("dtype"), b.pop("dtype")) == ("bfloat16", "float32")
      assert a == b, (name, part)
    assert (recipe.objective, recipe.seq_len, recipe.data.preprocess) == (
      cpu.objective,
      cpu.seq_len,
      cpu.data.preprocess,
    )
    assert (cpu.data.source, cpu.data.train_split, cpu.data.eval_split) == (
      "embedded",
      "train",
      "validation",
    )
    assert cpu.num_train_steps == 10 and cpu.batch_size == 8
    run_config.check_field_ranges(cpu)
    edge.from_config_dict(cpu, num_devices=1)
    with pytest.raises(ValueError, match="config variant 'tpu'.*lm1b_sw.py:cpu"):
      module.get_config("tpu")
  # The obvious override without the variant names the field to change.
  c = importlib.import_module("configs.lm1b_sw").get_config()
  c.data.source = "embedded"
  with pytest.raises(ValueError, match="eval_split='test'.*--config.data.eval_split=validation"):
    pipeline.validate_data_config(c.data)


BAD = [  # (field, value, allowed text)
  ("learning_rate", "-1.0", "a number in (0, inf)"),
  ("learning_rate", "0.0", "(0, inf)"),
  ("learning_rate", "inf", "(0, inf)"),  # trained to a NaN at step 1, blamed on the rate
  ("model.dropout", "1.5", "[0, 1)"),
  ("model.dropout", "-0.1", "[0, 1)"),
  ("warmup_steps", "-5", "an integer in [0, inf)"),
  ("num_eval_steps", "0", "[1, inf) or -1"),
  ("num_eval_steps", "-2", "[1, inf) or -1"),
  ("keep_checkpoints", "0", "[1, inf)"),
  ("batch_size", "0", "[1, inf)"),
  ("eval_batch_size", "-8", "[1, inf)"),
  ("seq_len", "2", "[4, inf)"),
  ("model.hidden_size", "0", "[1, inf)"),
  ("model.num_heads", "0", "[1, inf)"),
  ("model.rope_base", "-1.0", "(0, inf)"),
  ("loss.sampling_eps", "1.0", "(0, 1)"),
  ("loss.desired_set_size", "0", "[1, inf)"),
  ("adam_b1", "1.0", "[0, 1)"),
  ("adam_b2", "-0.5", "[0, 1)"),
  ("adam_eps", "0.0", "(0, inf)"),
  ("grad_clip_norm", "-1.0", "[0, inf)"),
  ("weight_decay", "-0.1", "[0, inf)"),
  ("cosine_alpha", "2.0", "[0, 1]"),
  ("ema_decay", "1.0", "[0, 1)"),
  ("log_every_steps", "0", "[1, inf)"),
  ("checkpoint_every_steps", "0", "[1, inf)"),
  ("eval_every_steps", "-1", "[1, inf)"),
  ("num_eval_samples", "-1", "[0, inf)"),
  ("grad_accum_steps", "0", "[1, inf)"),
  ("num_train_steps", "-1", "[0, inf)"),
  ("seed", "-3", "an integer in [0, 4294967295]"),
  ("divergence_factor", "0.5", "(1, inf) or 0"),
  ("divergence_patience", "0", "[1, inf)"),
  ("mesh.fsdp", "0", "[1, inf) or -1"),
  ("model.dtype", "float8", "one of 'float32'"),
  ("lr_schedule", "linear", "one of 'constant', 'cosine'"),
  ("eval_params", "best", "one of 'ema', 'raw'"),
  ("model.attention", "flash", "one of 'dense'"),
  ("data.read_threads", "-1", "[0, inf)"),
  ("objective", "diffusion", "one of 'setdlm'"),  # the registry's names, checked at the edge
]


def test_out_of_range_fields_give_one_error_line(tmp_path):
  fresh = str(tmp_path / "fresh")
  cases = [tiny_args(fresh) + [f"--config.{f}={v}"] for f, v, _ in BAD]
  cases.append(tiny_args(fresh, num_train_steps=0))  # in range, but not on a new workdir
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  first = str(tmp_path / "first")  # a first run whose data is empty: no tokenizer left behind
  cases.append(tiny_args(first, **{"data.source": "text", "data.paths": str(empty)}))
  results = harness("train.py", cases)
  assert_one_error_line(results.pop(), [f"{empty} (data.paths) is empty"], "empty data file")
  assert not os.path.exists(os.path.join(first, "tokenizer")), os.listdir(first)
  for (field, value, allowed), result in zip(BAD, results):
    assert_one_error_line(
      result, [f"{field}=", value.rstrip("0").rstrip("."), allowed], f"{field}={value}"
    )
    assert result["rc"] == 1
  assert_one_error_line(
    results[-1], ["num_train_steps=0", "new workdir", "train nothing"], "num_train_steps=0"
  )
  assert not os.path.exists(fresh)  # nothing written


# ----------------------------------------------------------------------------- provenance
def test_missing_config_json_with_checkpoints_is_refused(base, tmp_path):
  workdir = copy_of(base, tmp_path)
  os.remove(os.path.join(workdir, "config.json"))
  config = tiny_config(**{"loss.desired_set_size": 2})  # a different structure: S = 2
  with pytest.raises(
    errors.ConfigMismatchError, match="config.json is missing.*accept_missing_config=True"
  ):
    workdir_lock.check_resume(config, workdir)
  workdir_lock.check_resume(tiny_config(accept_missing_config=True), workdir)  # accepted


# ----------------------------------------------------------------------------- tokenizer ids
def test_resume_without_its_tokenizer_is_refused(base, tmp_path):
  """A trained tokenizer built anew for old checkpoints gives other ids: refused, nothing written."""
  workdir = copy_of(base, tmp_path)
  shutil.rmtree(os.path.join(workdir, "tokenizer"))
  with pytest.raises(ValueError, match="no saved tokenizer in .*copy the run's tokenizer/ folder"):
    train.train_and_evaluate(tiny_config(num_train_steps=3), workdir)
  assert not os.path.exists(os.path.join(workdir, "tokenizer"))
  assert listing(workdir) == ["1", "2"]


def test_a_first_run_refuses_a_left_tokenizer_of_another_size(base, tmp_path):
  """A first attempt killed before its first checkpoint leaves tokenizer/; a rerun with another
  tokenizer.vocab_size reused it and wrote the new size into config.json."""
  new = str(tmp_path / "new")
  shutil.copytree(os.path.join(base, "tokenizer"), os.path.join(new, "tokenizer"))
  size = json.load(open(os.path.join(new, "tokenizer", "special_tokens.json")))["vocab_size"]
  with pytest.raises(
    ValueError, match=f"holds a {size}-token tokenizer .*tokenizer.vocab_size=512"
  ):
    train.train_and_evaluate(tiny_config(**{"tokenizer.vocab_size": 512}), new)
  assert not os.path.exists(os.path.join(new, "config.json"))


def test_a_corpus_too_small_for_the_vocab_size_trains_and_resumes(tmp_path, caplog):
  """Probe round 16: a corpus holding fewer tokens than tokenizer.vocab_size gave the model the
  tokenizer's size without a word, then refused every resume as 'an earlier attempt's
  tokenizer', and refused both ways out its message gave. Now the first run says it in a
  warning and the same command resumes."""
  text = tmp_path / "small.txt"
  text.write_text("the cat sat on the mat\nthe dog sat on the log\n" * 40)
  fields = {"data.source": "text", "data.paths": str(text), "data.eval_paths": str(text)}
  workdir = str(tmp_path / "w")
  with caplog.at_level(logging.WARNING):
    assert train.train_and_evaluate(tiny_config(**fields), workdir)["step"] == 2
  size = json.load(open(os.path.join(workdir, "tokenizer", "special_tokens.json")))["vocab_size"]
  assert size < 384
  assert f"has {size} tokens, fewer than tokenizer.vocab_size=384" in caplog.text
  assert train.train_and_evaluate(tiny_config(num_train_steps=3, **fields), workdir)["step"] == 3


def test_init_from_a_run_with_other_token_ids_is_refused(base, tmp_path):
  """--config.init_from with other tokenizer settings (here lowercase) trains a tokenizer with
  other ids; starting from the source's tokenizer (the message's way out) works."""
  new = str(tmp_path / "new")
  with pytest.raises(
    ValueError, match="was trained with another tokenizer .* tokens have another id"
  ):
    train.train_and_evaluate(tiny_config(init_from=base, **{"tokenizer.lowercase": True}), new)
  assert not os.path.exists(os.path.join(new, "checkpoints", "1"))
  shutil.copytree(os.path.join(base, "tokenizer"), os.path.join(new, "tokenizer"))
  assert train.train_and_evaluate(tiny_config(init_from=base), new)["step"] == 2


def test_a_json_file_read_as_text_is_named(tmp_path, caplog):
  """Probe 18b: data.source=text given a .jsonl trained on its raw lines, braces and field names
  included, without a word."""
  data = tiny_config().data
  data.source, data.paths, data.eval_paths = "text", "a.txt,b.JSONL.gz", "v.json"
  assert train.warn_json_read_as_text(data) == ["b.JSONL.gz", "v.json"]
  assert "for JSON lines set --config.data.source=jsonl" in caplog.text
  data.paths, data.eval_paths = "a.txt,b.jsonl.txt", "v.txt.gz"
  assert train.warn_json_read_as_text(data) == []
  data.source, data.paths = "jsonl", "b.jsonl"
  assert train.warn_json_read_as_text(data) == []


def test_an_eval_file_that_is_also_trained_on_is_named(tmp_path, caplog):
  """data.eval_paths = data.paths gave an eval PPL on training data without a word."""
  data = tiny_config().data
  a, b = tmp_path / "a.txt", tmp_path / "b.txt"
  data.source, data.paths, data.eval_paths = (
    "text",
    f"{a},{b}",
    f"{tmp_path}/../{tmp_path.name}/b.txt",
  )
  assert train.warn_shared_eval_files(data) == [data.eval_paths]
  assert "also in data.paths: the eval numbers are measured on training data" in caplog.text
  data.eval_paths = str(tmp_path / "held_out.txt")
  assert train.warn_shared_eval_files(data) == []


def test_a_data_setting_the_source_never_reads_is_refused(tmp_path):
  """--config.data.prompt_style=gsm8k_chat (or jsonl_field, task_seed, ...) on an embedded-corpus
  run trained without a word and was recorded in config.json; a resume of a run that recorded
  such a field is not blocked by it (it was never part of the run's structure)."""
  new = str(tmp_path / "new")
  for field, value in (("prompt_style", "gsm8k_chat"), ("jsonl_field", "body"), ("task_seed", 7)):
    with pytest.raises(
      ValueError, match=f"^data.{field}={value!r} is not read by data.source=embedded"
    ):
      train.train_and_evaluate(tiny_config(**{f"data.{field}": value}), new)
  assert not os.path.exists(new)
  text = {"source": "text", "prompt_field": "question", "paths": "a.txt"}
  assert (
    workdir_lock.structural_changes({"data": text}, {"data": dict(text, prompt_field="prompt")})
    == []
  )
  pairs = dict(text, source="pairs_jsonl")
  assert workdir_lock.structural_changes(
    {"data": pairs}, {"data": dict(pairs, prompt_field="q")}
  ) == [("data.prompt_field", "question", "q")]


@pytest.mark.parametrize(
  "data, field, value",
  [
    ({"source": "arithmetic", "preprocess": "pad"}, "overlong", "wrap"),  # pairs: data.overflow
    ({"source": "embedded", "preprocess": "wrap"}, "overlong", "skip"),
    ({"source": "embedded", "preprocess": "pad"}, "wrap_style", "doc"),
  ],
)
def test_a_data_setting_the_preprocessing_never_reads_is_refused(data, field, value):
  """Probe round 11: data.overlong (read by `pad` on document sources) and data.wrap_style (read
  by `wrap`) were accepted where the rows never read them, recorded, and (structural) refused
  their own removal on a resume. Now refused up front; a recorded one does not block a resume."""
  config = pipeline.default_data_config()
  config.update(data)
  data_flags.check_fields(config, pipeline.default_data_config())  # their defaults pass
  config[field] = value
  want = f"^data.{field}={value!r} is not read by data.source={data['source']} with "
  with pytest.raises(ValueError, match=f"{want}data.preprocess={data['preprocess']}; it") as e:
    data_flags.check_fields(config, pipeline.default_data_config())
  assert "drop it" in str(e.value)
  old = dict(config.to_dict())
  assert workdir_lock.structural_changes({"data": old}, {"data": dict(old, **{field: "x"})}) == []
  reads = dict(old, preprocess="wrap" if field == "wrap_style" else "pad", source="text")
  assert workdir_lock.structural_changes({"data": reads}, {"data": dict(reads, **{field: "x"})})


def test_a_data_file_edited_between_runs_is_named_on_resume(tmp_path, caplog):
  """A training file edited in place between two calls: the resume went on at the checkpoint's
  document count into other documents, without a word. Now WORKDIR/data_files.json holds each
  file's size and sha256; a changed training file refuses the resume (nothing written), a
  changed eval file is a warning, and deleting data_files.json accepts the files as they are."""
  from setdiff_jax.data import sources
  from setdiff_jax.workdir import data_files

  docs = sources.embedded_corpus("train")
  train_file, eval_file = tmp_path / "train.txt", tmp_path / "eval.txt"
  train_file.write_text("\n\n".join(docs[:300]), encoding="utf-8")
  eval_file.write_text("\n\n".join(docs[300:340]), encoding="utf-8")
  files = {"data.source": "text", "data.paths": str(train_file), "data.eval_paths": str(eval_file)}
  w = str(tmp_path / "w")
  train.train_and_evaluate(tiny_config(**files), w)
  record = os.path.join(w, data_files.FILE)
  body = train_file.read_bytes()
  assert json.load(open(record))["paths"] == {
    str(train_file): {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
  }

  train_file.write_bytes(body.replace(b"e", b"a", 1))  # one byte, same size
  before = (listing(w), open(os.path.join(w, "config.json")).read(), open(record).read())
  with pytest.raises(errors.ConfigMismatchError, match=r"training data changed since") as e:
    train.train_and_evaluate(tiny_config(**files, num_train_steps=3), w)
  assert f"{train_file} (same size, other content)" in str(e.value)
  assert f"delete {record}" in str(e.value) and "init_from" in str(e.value)
  assert (listing(w), open(os.path.join(w, "config.json")).read(), open(record).read()) == before

  train_file.write_bytes(body)  # restored; the eval file grows: a warning, and recorded anew
  with open(eval_file, "a", encoding="utf-8") as f:
    f.write("\n\none more held-out paragraph.\n")
  assert train.train_and_evaluate(tiny_config(**files, num_train_steps=3), w)["step"] == 3
  assert f"evaluation file changed since the last start of {w}: {eval_file}" in caplog.text
  assert json.load(open(record))["eval_paths"][str(eval_file)]["bytes"] == eval_file.stat().st_size

  grown = body + b"\n\nappended paragraph.\n"
  train_file.write_bytes(grown)  # accepted once the record is gone
  with pytest.raises(errors.ConfigMismatchError, match=r"\d+ -> \d+ bytes, other content"):
    train.train_and_evaluate(tiny_config(**files, num_train_steps=4), w)
  os.remove(record)
  assert train.train_and_evaluate(tiny_config(**files, num_train_steps=4), w)["step"] == 4
  assert json.load(open(record))["paths"][str(train_file)]["bytes"] == len(grown)


def test_a_resume_after_a_crash_keeps_one_history_in_metrics_jsonl(base, tmp_path):
  """A run killed after logging past its last checkpoint, then resumed, had two rows per step
  (and the lost segment's evals) in metrics.jsonl and TensorBoard. The rows past the restored
  step now move to metrics.discarded.jsonl (marked with that step), and TensorBoard purges them."""
  from setdiff_jax.workdir import metrics

  w = copy_of(base, tmp_path)
  shutil.rmtree(os.path.join(w, "checkpoints", "2"))  # step 2 was logged (and evaluated), not saved
  with open(os.path.join(w, "metrics.jsonl"), "a", encoding="utf-8") as f:
    f.write('{"step": 2, "train/lo')  # and the crash cut a line
  rows = lambda name: [json.loads(ln) for ln in open(os.path.join(w, name))]  # noqa: E731
  before = [json.loads(ln) for ln in open(os.path.join(w, "metrics.jsonl")) if ln.endswith("\n")]
  assert {r["step"] for r in before} == {1, 2} and any("eval/nll" in r for r in before)
  assert train.train_and_evaluate(tiny_config(num_train_steps=3), w)["step"] == 3
  after = rows("metrics.jsonl")
  train_steps = [r["step"] for r in after if "train/loss" in r]
  assert train_steps == [1, 2, 3]  # one history: step 1 of the first call, 2-3 of the resume
  assert [r for r in after if r["step"] == 1] == [r for r in before if r["step"] == 1]
  assert rows(metrics.DISCARDED_FILE) == [
    dict(r, resumed_from_step=1) for r in before if r["step"] == 2
  ] + [{"unreadable_line": '{"step": 2, "train/lo', "resumed_from_step": 1}]


def test_a_loss_setting_the_method_never_reads_is_refused(tmp_path):
  """--config.loss.antithetic=True on SetDLM (or eos_last / S on AR, ...) trained bit-identically
  to the run without it, was recorded, and (loss.* is structural) blocked a later resume. Now it
  is refused; a field an older config.json recorded for a method that never read it is no part
  of the resume check (configs/reasoning_common.py gave every method S_max = 8)."""
  new = str(tmp_path / "new")
  for objective, field, value, readers, default in (
    ("setdlm", "antithetic", True, "mdlm, bd3lm", False),
    ("setdlm", "sampling_eps", 0.5, "mdlm, bd3lm", 0.001),
    ("setdlm", "block_size", 8, "bd3lm", 4),
    ("ar", "eos_last", True, "setdlm", False),
    ("ar", "desired_set_size", 8, "setdlm", 4),
    ("mdlm", "ar_first_answer_token", False, "ar", True),
  ):
    extra = {"objective": objective, f"loss.{field}": value}
    if objective == "mdlm":
      extra["model.adaln"] = True
    with pytest.raises(
      ValueError,
      match=rf"^loss.{field}={value!r} is not read by objective={objective}; it applies to "
      rf"objective {readers} only: drop it, or where the --config file sets it, set "
      rf"--config.loss.{field}={default!r} \(its default\)$",
    ):
      train.train_and_evaluate(tiny_config(**extra), new)
  assert not os.path.exists(new)
  from setdiff_jax.trainer import session

  unread = session.unread_settings  # what trainer.locked passes to the resume check
  old = {"objective": "ar", "loss": {"max_set_size": 8, "keep_clean_bos": False}}
  assert workdir_lock.structural_changes(old, dict(old, loss={"max_set_size": 0}), unread) == []
  assert workdir_lock.structural_changes(
    old, dict(old, loss={"max_set_size": 0, "keep_clean_bos": True}), unread
  ) == [("loss.keep_clean_bos", False, True)]
  sw = dict(old, objective="setdlm")
  assert workdir_lock.structural_changes(sw, dict(sw, loss={"max_set_size": 0}), unread) == [
    ("loss.max_set_size", 8, 0)
  ]


def test_a_vocab_size_a_fixed_vocabulary_never_reads_is_refused(tmp_path):
  """Probe round 16: tokenizer.vocab_size=300 on a wordpiece run (the BERT vocabulary fixes 30522)
  was accepted and recorded in config.json, and (tokenizer.* is structural) dropping it later
  refused the resume. Now it is refused; an older config.json's value is no part of the resume
  check when its tokenizer was not trained."""
  from setdiff_jax.data import tokenizers
  from setdiff_jax.trainer import session

  new = str(tmp_path / "new")
  extra = {
    "tokenizer.kind": "wordpiece",
    "tokenizer.vocab_path": tokenizers.packaged_vocab("bert-base-uncased/vocab.txt"),
    "tokenizer.vocab_size": 300,
  }
  with pytest.raises(
    ValueError,
    match=r"^tokenizer.vocab_size=300 is not read by tokenizer.kind=wordpiece \(its vocabulary "
    r"file gives the size\); .* set --config.tokenizer.vocab_size=4096 \(its default\)$",
  ):
    train.train_and_evaluate(tiny_config(**extra), new)
  assert not os.path.exists(new)
  old = {"objective": "setdlm", "tokenizer": {"kind": "wordpiece", "vocab_size": 300}}
  now = {"objective": "setdlm", "tokenizer": {"kind": "wordpiece", "vocab_size": 4096}}
  assert workdir_lock.structural_changes(old, now, session.unread_settings) == []
  trained = {"objective": "setdlm", "tokenizer": {"kind": "trained", "vocab_size": 300}}
  assert workdir_lock.structural_changes(
    trained,
    dict(trained, tokenizer={"kind": "trained", "vocab_size": 512}),
    session.unread_settings,
  ) == [("tokenizer.vocab_size", 300, 512)]


# ----------------------------------------------------------------------------- eval history
def test_eval_history_appends_and_keeps_labels(base, tmp_path):
  from setdiff_jax.evaluation import run

  opts = run.EvalOptions(num_orders=1, max_rows=8, batch_size=8)
  out = str(tmp_path / "results.json")
  shown = []
  ema2 = run.evaluate_workdir(
    base, ["likelihood"], opts, use_ema=True, log=None, output=out, show=shown.append
  )
  assert shown and "Likelihood" in shown[0]
  run.evaluate_workdir(base, ["likelihood"], opts, step=1, use_ema=True, log=None, output=out)
  raw2 = run.evaluate_workdir(base, ["likelihood"], opts, use_ema=False, log=None, output=out)
  saved = json.load(open(out))
  keys = sorted(saved["history"])
  assert [k.split(" settings=")[0] for k in keys] == [
    "step=1 params=ema eval=likelihood",
    "step=2 params=ema eval=likelihood",
    "step=2 params=raw eval=likelihood",
  ]
  by = {(v["step"], v["use_ema"]): v["result"] for v in saved["history"].values()}
  assert by[(2, True)]["nll"] == ema2["likelihood"]["nll"]  # not replaced, not relabelled
  assert by[(2, False)]["nll"] == raw2["likelihood"]["nll"]
  assert saved["step"] == 2 and saved["use_ema"] is False  # the top level: the latest eval
  other = run.EvalOptions(num_orders=1, max_rows=16, batch_size=8)  # other settings: a new key
  run.evaluate_workdir(base, ["likelihood"], other, use_ema=True, log=None, output=out)
  assert len(json.load(open(out))["history"]) == 4


def test_eval_output_that_is_not_a_results_file_or_lies_in_a_run_folder_is_refused(base, tmp_path):
  """--output=WORKDIR/config.json or the run's tokenizer.json would be overwritten (and a resume
  check bypassed); a new file under checkpoints/ would be deleted by retention or read as a
  damaged checkpoint. All are refused before anything runs, and nothing is written."""
  from setdiff_jax.evaluation import run

  workdir = copy_of(base, tmp_path)
  opts = run.EvalOptions(num_orders=1, max_rows=8, batch_size=8)
  tokenizer_copy = str(tmp_path / "tokenizer.json")  # the same content outside the run
  shutil.copy(os.path.join(workdir, "tokenizer", "tokenizer.json"), tokenizer_copy)
  for target, why in (
    (os.path.join(workdir, "config.json"), "is not an evaluation results file"),
    (tokenizer_copy, "is not an evaluation results file"),
    (os.path.join(workdir, "tokenizer", "tokenizer.json"), "inside tokenizer/ of the run"),
  ):
    before = open(target).read()
    with pytest.raises(ValueError, match=why):
      run.evaluate_workdir(workdir, ["likelihood"], opts, log=None, output=target)
    assert open(target).read() == before
  inside = os.path.join(workdir, "checkpoints", "2", "results.json")
  with pytest.raises(ValueError, match=r"inside checkpoints/2/ of the run directory"):
    run.evaluate_workdir(workdir, ["likelihood"], opts, log=None, output=inside)
  assert not os.path.exists(inside)
  top = os.path.join(workdir, "eval_raw.json")  # a file of its own at the run's top level: allowed
  run.evaluate_workdir(workdir, ["likelihood"], opts, use_ema=False, log=None, output=top)
  assert json.load(open(top))["likelihood"]["num_sequences"] == 8
  # Probe round 11: results at another run's top level (its eval_results.json: that run's own
  # evaluation later replaced them, without a word) are refused.
  other = copy_of(base, tmp_path, "other")
  for name in ("eval_results.json", "eval_raw.json"):
    target = os.path.join(other, name)
    with pytest.raises(ValueError, match=f"is in the run directory {other}, not in this run's"):
      run.evaluate_workdir(workdir, ["likelihood"], opts, log=None, output=target)
    assert not os.path.exists(target)


def test_eval_output_holding_another_runs_results_is_refused(base, tmp_path):
  from setdiff_jax.evaluation import run

  out = tmp_path / "results.json"
  earlier = {"workdir": "/elsewhere/other_run", "step": 7, "likelihood": {"nll": 1.0}}
  out.write_text(json.dumps(earlier))
  opts = run.EvalOptions(num_orders=1, max_rows=8, batch_size=8)
  with pytest.raises(ValueError, match="holds the results of another run"):
    run.evaluate_workdir(base, ["likelihood"], opts, log=None, output=str(out))
  assert json.load(open(out)) == earlier


def test_two_evaluations_writing_one_file_keep_both_results(base, tmp_path):
  """A second evaluation writes the file while the first is between its evaluation and its write
  (its `show` callback runs there): the first merges into what is on disk instead of replacing it."""
  from setdiff_jax.evaluation import run

  out = str(tmp_path / "results.json")
  first = run.EvalOptions(num_orders=1, max_rows=8, batch_size=8)
  second = run.EvalOptions(num_orders=1, max_rows=4, batch_size=4)

  def meanwhile(text):
    run.evaluate_workdir(base, ["likelihood"], second, use_ema=False, log=None, output=out)

  run.evaluate_workdir(
    base, ["likelihood"], first, use_ema=True, log=None, output=out, show=meanwhile
  )
  history = json.load(open(out))["history"].values()
  assert sorted((h["use_ema"], h["result"]["num_sequences"]) for h in history) == [
    (False, 4),
    (True, 8),
  ]


def test_results_lock_excludes_a_second_writer_and_never_hangs(base, tmp_path, monkeypatch):
  """Held past its bound, the lock is not taken over: a merge without it let the stalled holder's
  later write drop this evaluation's result (probe round 12). The new results are kept in a file
  the one line names; the results file is untouched."""
  import fcntl

  from setdiff_jax.evaluation import results as results_lib
  from setdiff_jax.evaluation import run

  path = str(tmp_path / "r.json")
  monkeypatch.setattr(results_lib, "LOCK_WAIT_S", 0.2)
  with results_lib.locked(path):
    fd = os.open(str(tmp_path / ".r.json.lock"), os.O_RDWR)
    with pytest.raises(BlockingIOError):  # another open of the lock file cannot take it
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    with pytest.raises(results_lib.LockBusy, match=r"held .*\.r\.json\.lock for 0 s"):
      with results_lib.locked(path):  # held elsewhere past the bound: refused, never a hang
        pass
    with open(path, "w") as f:
      f.write("{}")
    before = open(path).read()
    with pytest.raises(results_lib.LockBusy, match="could not write the evaluation results") as e:
      run.evaluate_workdir(
        base,
        ["likelihood"],
        run.EvalOptions(num_orders=1, max_rows=8, batch_size=8),
        log=None,
        output=path,
      )
  assert open(path).read() == before and "\n" not in str(e.value)
  kept = str(e.value).split("kept in ")[1].split(". ")[0]
  assert json.load(open(kept))["likelihood"]["num_sequences"] == 8
  os.remove(kept)


def test_eval_results_survive_a_failed_write(base, tmp_path):
  from setdiff_jax.evaluation import run

  blocker = tmp_path / "a_file"  # a file where the output's directory should be (works as root)
  blocker.write_text("")
  shown = []
  with pytest.raises(OSError, match="could not write the evaluation results") as e:
    run.evaluate_workdir(
      base,
      ["likelihood"],
      run.EvalOptions(num_orders=1, max_rows=8, batch_size=8),
      log=None,
      output=str(blocker / "r.json"),
      show=shown.append,
    )
  kept = str(e.value).split("kept in ")[1].split(". ")[0]
  assert "Likelihood" in shown[0] and json.load(open(kept))["likelihood"]["num_sequences"] == 8
  os.remove(kept)


# ----------------------------------------------------------------------------- signals
@pytest.mark.slow
def test_sigint_saves_and_stops_with_a_distinct_status(base, tmp_path, monkeypatch):
  import io
  import signal
  import threading

  from setdiff_jax import cli, sharding

  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers can only be installed from the main thread")
  workdir = copy_of(base, tmp_path)
  real = sharding.global_batch
  calls = {"n": 0}
  before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest was started in the background

  def global_batch(local, mesh):  # Ctrl-C while step 3 runs
    calls["n"] += 1
    if calls["n"] == 1:
      os.kill(os.getpid(), signal.SIGINT)
    return real(local, mesh)

  monkeypatch.setattr(sharding, "global_batch", global_batch)
  config = checkpointing.load_config(workdir)
  config.num_train_steps = 5
  with pytest.raises(errors.StoppedBySignal) as e:
    train.train_and_evaluate(config, workdir)
  assert signal.getsignal(signal.SIGINT) is before  # put back
  stream = io.StringIO()
  assert cli.report(e.value, stream) == 130
  lines = stream.getvalue().splitlines()
  assert len(lines) == 1 and lines[0].startswith("stopped: SIGINT at step 3/5; checkpoint "), lines
  assert "checkpoints/3 saved" in lines[0] and "run the same command again" in lines[0].lower()
  assert workdir_lib.load_inference_state(workdir).step == 3
  assert workdir_lib.load_inference_state(workdir, step=2).step == 2  # earlier ones still load


SECOND_CTRL_C = """
import os, signal, sys, time
from setdiff_jax.workdir import preemption
with preemption.Preemption() as p:
  os.kill(os.getpid(), signal.SIGINT)
  assert p.requested and p.name == "SIGINT"
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(30)
print("not aborted")
"""


def test_second_ctrl_c_aborts_at_once():
  import subprocess
  import sys

  r = subprocess.run(
    [sys.executable, "-c", SECOND_CTRL_C],
    capture_output=True,
    text=True,
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=REPO),
    timeout=120,
  )
  lines = [l for l in r.stderr.splitlines() if l.strip()]
  assert r.returncode == 130 and "not aborted" not in r.stdout, (r.returncode, r.stderr[-2000:])
  assert lines[-1].startswith("aborted: second SIGINT"), lines
  assert len(lines) == 2 and "SIGINT received" in lines[0], lines  # the first one's warning


# ----------------------------------------------------------------------------- remaining errors
def test_disk_full_of_any_exception_type_is_named(base, tmp_path):
  class Manager:  # orbax wraps tensorstore's error in whatever type it likes
    directory = os.path.join(base, "checkpoints")

    def save(self, *a, **k):
      raise ValueError(
        'Error writing local file "/x/d/abc": RESOURCE_EXHAUSTED: [OS error: '
        "No space left on device]"
      )

    def all_steps(self):
      return [1, 2]

  with pytest.raises(errors.DiskFullError) as e:
    checkpointing.save(Manager(), 3, {"w": 1})
  msg = str(e.value)
  assert msg.startswith("disk full while saving checkpoint 3") and "(step 2) is intact" in msg
  assert "tensorstore_spec" not in msg and len(msg.splitlines()) == 1


@pytest.mark.slow
def test_damaged_inputs_name_the_file(base, tmp_path):
  import gzip
  import lzma

  import numpy as np
  from safetensors.numpy import save_file

  from setdiff_jax.interop import weight_files

  text = "".join(f"paragraph {i} of some training text\n\n" for i in range(4000)).encode()
  cut = {}
  for ext, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
    path = tmp_path / f"data{ext}"
    blob = compress(text)
    path.write_bytes(blob[: len(blob) // 2])
    cut[ext] = str(path)
  fresh = str(tmp_path / "fresh")
  cases = [
    (
      tiny_args(fresh, **{"data.source": "text", "data.paths": cut[".gz"]}),
      [cut[".gz"], "truncated or damaged"],
    ),
    (
      tiny_args(fresh, **{"data.source": "text", "data.paths": cut[".xz"]}),
      [cut[".xz"], "truncated or damaged"],
    ),
    (
      tiny_args(fresh, **{"data.source": "text", "data.paths": str(tmp_path)}),
      [str(tmp_path), "is a directory", "data.paths"],
    ),
  ]
  for (args, expected), result in zip(cases, harness("train.py", [a for a, _ in cases])):
    assert_one_error_line(result, expected, args[-1])
    assert result["rc"] == 1
  assert not os.path.exists(os.path.join(fresh, "tokenizer"))
  w = f"--workdir={base}"
  evaluate = [
    ([w, "--eval=speed", "--thresholds=abc"], ["--thresholds=abc", "'off'"]),
    ([w, "--eval=infill", "--infill_thresholds=0.9,2"], ["--infill_thresholds=0.9,2"]),
  ]
  for (args, expected), result in zip(evaluate, harness("evaluate.py", [a for a, _ in evaluate])):
    assert_one_error_line(result, expected, " ".join(args))
  weights = tmp_path / "model.safetensors"
  save_file({"a": np.zeros((64, 64), np.float32)}, str(weights))
  weights.write_bytes(weights.read_bytes()[:2000])
  with pytest.raises(ValueError, match=f"{weights} is truncated or damaged"):
    weight_files.read_state_dict(str(weights))
