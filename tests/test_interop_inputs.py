"""Bad or unusual inputs to the checkpoint exporters and importer (`setdiff_jax/interop`): each is
refused with one error naming the problem and the fix, or handled as PyTorch / HF would write it;
never a silent wrong result (old weights read back, a run's config.json replaced).

Tiny models only (DiT d=32 from test_interop.py, a 2-layer Qwen3 d=32); numpy and safetensors,
no torch.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers import random_params
from test_interop import SPECIAL, perturbed_params, run_config

from setdiff_jax.interop import export_checkpoint, export_qwen3_hf, import_checkpoint, name_map
from setdiff_jax.interop import weight_files
from setdiff_jax.models.qwen3 import Qwen3Config

QWEN = dict(
  vocab_size=64,
  hidden_size=32,
  num_layers=2,
  num_heads=2,
  num_kv_heads=1,
  head_dim=16,
  intermediate_size=64,
)
QWEN_SPECIAL = {"bos_id": 0, "eos_id": 0, "pad_id": 0, "mask_id": 1}


def qwen3_run():
  """(run config, params) of a tiny Qwen3 SetDLM run."""
  from setdiff_jax.config.run import default_config

  c = default_config()
  c.objective, c.seq_len = "setdlm", 16
  c.model.backbone = "qwen3"
  for k, v in QWEN.items():
    c.model[k] = v
  return c, random_params(Qwen3Config(**QWEN))


def tree_equal(a, b) -> bool:
  fa, fb = name_map.flatten(a), name_map.flatten(b)
  return set(fa) == set(fb) and all(np.array_equal(fa[k], np.asarray(fb[k])) for k in fa)


def snapshot(path) -> dict:
  """{relative file: bytes} of everything under `path`."""
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      full = os.path.join(root, f)
      out[os.path.relpath(full, path)] = open(full, "rb").read()
  return out


def shard(d, prefix="model", ext="safetensors"):
  """Rewrites `d`'s model.safetensors as two shards + index, as save_pretrained(max_shard_size)."""
  sd = load_file(os.path.join(d, weight_files.SAFETENSORS_FILE))
  os.remove(os.path.join(d, weight_files.SAFETENSORS_FILE))
  keys = sorted(sd)
  names = [f"{prefix}-0000{i}-of-00002.{ext}" for i in (1, 2)]
  parts = {names[0]: keys[: len(keys) // 2], names[1]: keys[len(keys) // 2 :]}
  for f, ks in parts.items():
    save_file({k: sd[k] for k in ks}, os.path.join(d, f))
  index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
  with open(os.path.join(d, weight_files.SAFETENSORS_FILE + ".index.json"), "w") as f:
    json.dump(index, f)


def workdir(path):
  """A training workdir layout (README "Workdir layout"): config.json beside checkpoints/."""
  os.makedirs(os.path.join(path, "checkpoints", "100"))
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write('{"objective": "setdlm", "note": "the run\'s resolved config"}')
  return str(path)


# ----------------------------------------------------------------------------- stale weights
def test_reexport_over_a_sharded_checkpoint_replaces_its_weights(tmp_path):
  """Finding 1: an earlier sharded checkpoint (index + shards) in the folder is removed on
  overwrite; the importer reads the new weights, not the old index's."""
  c = run_config()
  old, new = perturbed_params(c, seed=0), perturbed_params(c, seed=1)
  d = str(tmp_path / "e")
  export_checkpoint(c, old, d, special_ids=SPECIAL)
  shard(d)
  assert tree_equal(import_checkpoint(d)[1], old)
  # a .bin index + shards (the official push's format) are removed too, even unreadable ones
  open(os.path.join(d, "pytorch_model.bin.index.json"), "w").write("not json")
  open(os.path.join(d, "pytorch_model-00001-of-00002.bin"), "w").write("old")
  open(os.path.join(d, "notes.txt"), "w").write("kept")  # not a weight file: left alone
  export_checkpoint(c, new, d, special_ids=SPECIAL)
  assert sorted(os.listdir(d)) == [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "notes.txt",
  ]
  assert tree_equal(import_checkpoint(d)[1], new)


def test_a_folder_with_two_saves_reads_the_single_file_as_transformers_does(tmp_path, caplog):
  """Probe 18a: transformers' sharded save into a folder leaves an earlier model.safetensors (and
  its single save an earlier index): transformers reads the single file, we read the shards, so
  one folder gave two models without a word. Now the single file, in both cases, warned once; a
  stale index whose shards are gone no longer refuses the folder."""
  c = run_config()
  old, new = perturbed_params(c, seed=0), perturbed_params(c, seed=1)
  sharded = str(tmp_path / "sharded")
  export_checkpoint(c, new, sharded, special_ids=SPECIAL)
  shard(sharded)
  d = str(tmp_path / "e")
  export_checkpoint(c, old, d, special_ids=SPECIAL)
  for f in os.listdir(sharded):
    if f.startswith("model"):
      shutil.copy(os.path.join(sharded, f), d)
  raw = weight_files.read_json(os.path.join(d, "config.json"))
  del raw["setdiff_jax"]["export_id"]  # weights of two exports: compared by the id otherwise
  weight_files.write_json(raw, os.path.join(d, "config.json"))
  with caplog.at_level(logging.WARNING):
    assert tree_equal(import_checkpoint(d)[1], old)
  warned = [r.getMessage() for r in caplog.records if "two saves into one folder" in r.getMessage()]
  assert warned == [
    f"{d} holds both model.safetensors and model.safetensors.index.json (two saves into one "
    "folder): reading model.safetensors, as transformers does; delete the stale one"
  ]
  for f in os.listdir(d):  # the single save's cleanup: the shards go, the index stays
    if f.startswith("model-"):
      os.remove(os.path.join(d, f))
  assert tree_equal(import_checkpoint(d)[1], old)
  os.remove(os.path.join(d, weight_files.SAFETENSORS_FILE))  # the index alone: its shards named
  with pytest.raises(FileNotFoundError, match="names shards that are not in .*delete the index"):
    import_checkpoint(d)


@pytest.mark.parametrize("layout", ["official", "hf"])
def test_qwen3_reexport_over_a_sharded_checkpoint_replaces_its_weights(tmp_path, layout):
  """Finding 1, Qwen3: the official-layout and the plain HF exporters remove the old shards."""
  c, old = qwen3_run()
  new = random_params(Qwen3Config(**QWEN), seed=1)
  d = str(tmp_path / layout)

  def export(p):
    if layout == "hf":
      return export_qwen3_hf(c, p, d)
    return export_checkpoint(c, p, d, special_ids=QWEN_SPECIAL)

  export(old)
  shard(d)
  assert tree_equal(import_checkpoint(d)[1], old)
  export(new)
  names = os.listdir(d)
  assert "model.safetensors" in names and not [n for n in names if "index" in n or "-of-" in n]
  assert tree_equal(import_checkpoint(d)[1], new)


# ----------------------------------------------------------------------------- run directories
@pytest.mark.parametrize("backbone", ["dit", "qwen3", "qwen3-hf"])
def test_export_refuses_a_training_workdir(tmp_path, backbone):
  """Finding 2: export_checkpoint (every backbone) and export_qwen3_hf refuse a training workdir
  or a folder inside one, whatever `overwrite`; the run's files are untouched."""
  if backbone == "dit":
    c = run_config()
    p = perturbed_params(c)
  else:
    c, p = qwen3_run()

  def export(out, **kw):
    if backbone == "qwen3-hf":
      return export_qwen3_hf(c, p, out, **kw)
    return export_checkpoint(c, p, out, special_ids=SPECIAL, **kw)

  w = workdir(tmp_path / "W")
  before = snapshot(tmp_path)
  for overwrite in (True, False):
    with pytest.raises(ValueError, match="is a training workdir") as e:
      export(w, overwrite=overwrite)
    assert "\n" not in str(e.value) and f"e.g. {os.path.realpath(w)}_export" in str(e.value)
  with pytest.raises(ValueError, match="is inside the training run"):
    export(os.path.join(w, "export"))
  assert snapshot(tmp_path) == before
  export(str(tmp_path / "W_export"))  # the suggested folder is fine
  assert os.path.isfile(tmp_path / "W_export" / "config.json")


# ----------------------------------------------------------------------------- overwrite=False
@pytest.mark.parametrize("layout", ["official", "hf"])
def test_qwen3_export_honours_overwrite_false(tmp_path, layout):
  """Finding 3: overwrite=False refuses a non-empty folder on the Qwen3 paths, as on the DiT one."""
  c, p = qwen3_run()
  d = tmp_path / "d"
  d.mkdir()
  (d / "config.json").write_text('{"precious": true}')
  (d / "model.safetensors").write_text("someone else's weights")
  before = snapshot(tmp_path)
  with pytest.raises(FileExistsError, match="is not empty; choose a new directory or pass"):
    if layout == "hf":
      export_qwen3_hf(c, p, str(d), overwrite=False)
    else:
      export_checkpoint(c, p, str(d), special_ids=QWEN_SPECIAL, overwrite=False)
  assert snapshot(tmp_path) == before
  out = str(tmp_path / "new")  # an absent folder is fine with overwrite=False
  if layout == "hf":
    export_qwen3_hf(c, p, out, overwrite=False)
  else:
    export_checkpoint(c, p, out, special_ids=QWEN_SPECIAL, overwrite=False)
  assert tree_equal(import_checkpoint(out)[1], p)


# ----------------------------------------------------------------------------- half precision
def _rewrite(d, edit):
  path = os.path.join(d, weight_files.SAFETENSORS_FILE)
  sd = load_file(path)
  save_file(edit(sd), path, metadata={"format": "pt"})


def test_import_all_fp16_checkpoint(tmp_path):
  """Finding 4: model.half().save_pretrained stores the rotary buffer in fp16 too; it imports
  (weights converted to float32), and so does a buffer read back as float32 from bf16."""
  c = run_config()
  p = perturbed_params(c)
  d = export_checkpoint(c, p, str(tmp_path / "e"), special_ids=SPECIAL)
  _rewrite(d, lambda sd: {k: v.astype(np.float16) for k, v in sd.items()})
  with pytest.warns(UserWarning, match="converted to float32"):
    _, q = import_checkpoint(d)
  fp, fq = name_map.flatten(p), name_map.flatten(q)
  for k in fp:
    np.testing.assert_array_equal(fq[k], fp[k].astype(np.float16).astype(np.float32))

  import ml_dtypes  # a bf16 file read through torch: float32 values that are bf16-exact

  key = "backbone." + name_map.ROTARY_KEY
  bf16 = name_map.rotary_inv_freq(32 // 4).astype(ml_dtypes.bfloat16).astype(np.float32)
  _rewrite(d, lambda sd: {**sd, key: bf16})
  with pytest.warns(UserWarning, match="converted to float32"):
    import_checkpoint(d)
  # an all-bf16 safetensors file (what most released checkpoints are): safetensors 0.8 reads it
  # into numpy as ml_dtypes.bfloat16, which np.floating does not cover (probe round 13: refused)
  _rewrite(d, lambda sd: {k: v.astype(ml_dtypes.bfloat16) for k, v in sd.items()})
  with pytest.warns(UserWarning, match="converted to float32"):
    _, q = import_checkpoint(d)
  fq = name_map.flatten(q)
  for k in fp:  # the file held fp16 values: rounded twice
    want = fp[k].astype(np.float16).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(fq[k], want)


def test_import_fp16_rotary_of_another_base_is_refused(tmp_path):
  """Finding 4: the fp16 tolerance is one fp16 ulp; a buffer of another base (or head dim) is
  still refused, with the fix."""
  c = run_config()
  d = export_checkpoint(c, perturbed_params(c), str(tmp_path / "e"), special_ids=SPECIAL)
  key = "backbone." + name_map.ROTARY_KEY
  other = name_map.rotary_inv_freq(32 // 4, 20000.0)
  _rewrite(d, lambda sd: {k: v.astype(np.float16) for k, v in {**sd, key: other}.items()})
  with pytest.raises(ValueError, match=r"inv_freq does not match .*\(stored as float16\)") as e:
    import_checkpoint(d)
  assert "fix setdiff_jax.rope_base" in str(e.value)
  # one fp16 ulp of noise on the right base is fine; 1% is not
  right = name_map.rotary_inv_freq(32 // 4, 10000.0).astype(np.float16)
  _rewrite(d, lambda sd: {**sd, key: np.nextafter(right, np.float16(2))})
  with pytest.warns(UserWarning, match="converted to float32"):
    import_checkpoint(d)
  _rewrite(d, lambda sd: {**sd, key: (right * np.float16(1.01)).astype(np.float16)})
  with pytest.raises(ValueError, match="inv_freq does not match"):
    import_checkpoint(d)


# ----------------------------------------------------------------------------- model dims
@pytest.mark.parametrize(
  "heads, match",
  [
    (3, "num_heads=3, hidden_size=32\\) cannot be exported: .*not divisible"),
    (32, "num_heads=32, hidden_size=32\\) cannot be exported: .*even"),  # head dim 1
    (None, "model.num_heads is not set"),
  ],
)
def test_export_refuses_heads_the_importer_refuses(tmp_path, heads, match):
  """Finding 5: model dims the importer would refuse are refused before anything is written (a
  plain-dict config without num_heads too: no raw TypeError)."""
  c = run_config()
  p = perturbed_params(c)
  if heads is None:
    c = {"seq_len": 12, "objective": "setdlm", "model": {"hidden_size": 32}}
  else:
    c.model.num_heads = heads
  out = tmp_path / "e"
  with pytest.raises(ValueError, match=match) as e:
    export_checkpoint(c, p, str(out), special_ids=SPECIAL)
  assert "\n" not in str(e.value) and "set model.num_heads" in str(e.value)
  assert not out.exists()


def test_a_qwen3_run_exported_as_bin_is_refused_before_the_restore(tmp_path):
  """Probe 18a: --format=bin on a Qwen3 run was refused only after its checkpoint was restored
  (minutes for a large one), naming no flag. The run's config.json decides: a workdir with no
  checkpoint gets the format line, not the restore's error."""
  pytest.importorskip("torch")
  from setdiff_jax.interop import export_workdir

  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(json.dumps({"model": {"backbone": "qwen3"}}))
  with pytest.raises(ValueError) as e:
    export_workdir(str(run), str(tmp_path / "out"), fmt="bin")
  assert str(e.value) == (
    f"--format=bin: {run} is a Qwen3 run, exported in the official Qwen3-SetDLM layout as "
    "model.safetensors only; drop --format"
  )
  assert not (tmp_path / "out").exists()
