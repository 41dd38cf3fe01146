"""An export's folder holds one whole export or none (`setdiff_jax/interop/staging.py`, probe round
12): an interrupted export leaves the folder as it was, a kill while publishing leaves no
config.json, two exports racing for one folder never mix, and the weights of one export never
import under another's config.json. Tiny DiT (test_interop.py), numpy only."""

import os
import shutil
import socket
import stat
import subprocess
import sys

import jax
import pytest
from safetensors.numpy import load_file, save_file

from helpers import flip_tensor_bit
from test_interop import SPECIAL, perturbed_params, run_config
from test_interop_inputs import snapshot, tree_equal

from setdiff_jax.interop import export_checkpoint, export_workdir, import_checkpoint
from setdiff_jax.interop import export as export_lib
from setdiff_jax.interop import weight_files


class Tok:
  """The tokenizer interface an export reads: special ids and `save`."""

  bos_id, eos_id, pad_id, mask_id = (SPECIAL[k] for k in ("bos_id", "eos_id", "pad_id", "mask_id"))
  vocab_size = None

  def save(self, d):
    for name in ("tokenizer.json", "special_tokens.json"):
      with open(os.path.join(d, name), "w") as f:
        f.write("{}")


def exports(seeds=(1, 2)):
  c = run_config()
  return c, [perturbed_params(c, seed=s) for s in seeds]


def test_an_interrupted_export_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
  """Ctrl-C (or any error) before the export is whole: the old export is untouched, nothing
  staged is left (the finding: the new weights landed under the old config.json)."""
  c, (old, new) = exports()
  d = str(tmp_path / "e")
  export_checkpoint(c, old, d, tokenizer=Tok())
  before = snapshot(tmp_path)
  real = weight_files.write_json

  def interrupted(obj, path):
    real(obj, path)
    raise KeyboardInterrupt

  monkeypatch.setattr(weight_files, "write_json", interrupted)
  with pytest.raises(KeyboardInterrupt):
    export_checkpoint(c, new, d, tokenizer=Tok(), overwrite=True)
  assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["e"]
  assert tree_equal(import_checkpoint(d)[1], old)


def test_a_kill_while_publishing_leaves_no_config_json(tmp_path, monkeypatch):
  """Publishing removes the old config.json first and moves the new one in last: stopped in
  between, the folder is no checkpoint, and the import says what happened."""
  c, (old, new) = exports()
  d = tmp_path / "e"
  export_checkpoint(c, old, str(d), tokenizer=Tok())
  (d / "notes.txt").write_text("mine")
  real = os.replace

  def dies(src, dst):
    if os.path.basename(dst) == "tokenizer.json":  # after model.safetensors moved in
      raise KeyboardInterrupt
    real(src, dst)

  monkeypatch.setattr(os, "replace", dies)
  with pytest.raises(KeyboardInterrupt):
    export_checkpoint(c, new, str(d), tokenizer=Tok(), overwrite=True)
  monkeypatch.setattr(os, "replace", real)
  names = os.listdir(d)
  assert "config.json" not in names and {"model.safetensors", "notes.txt"} <= set(names)
  with pytest.raises(FileNotFoundError, match="holds weights but no config.json: an export into"):
    import_checkpoint(str(d))
  export_checkpoint(c, new, str(d), tokenizer=Tok(), overwrite=True)  # the fix the line names
  assert tree_equal(import_checkpoint(str(d))[1], new)


def test_a_stage_a_killed_export_left_is_removed_by_the_next(tmp_path):
  c, (p,) = exports(seeds=(1,))
  host = socket.gethostname()
  gone = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
  ).stdout.strip()  # a process that has exited
  abandoned = tmp_path / f".e.export-{host}-{gone}-x1"
  running = tmp_path / f".e.export-{host}-{os.getpid()}-x2"  # a live export's: kept
  for stage in (abandoned, running):
    stage.mkdir()
    (stage / "model.safetensors").write_text("half")
  export_checkpoint(c, p, str(tmp_path / "e"), special_ids=SPECIAL)
  assert not abandoned.exists() and running.exists()


@pytest.mark.parametrize("folder", ["absent", "empty"])
def test_two_exports_racing_for_one_folder_never_mix(tmp_path, monkeypatch, folder):
  """Both passed the "new or empty" check; the one that publishes first wins, the other is refused
  and publishes nothing (the finding: both exited 0, the folder held one's weights under the
  other's config.json)."""
  c, (a, b) = exports()
  d = tmp_path / "e"
  if folder == "empty":
    d.mkdir()
  real = export_lib._write_export

  def meanwhile(stage, *args):
    real(stage, *args)  # A is written, not yet published ...
    monkeypatch.setattr(export_lib, "_write_export", real)
    export_checkpoint(c, b, str(d), special_ids=SPECIAL, overwrite=False)  # ... B publishes

  monkeypatch.setattr(export_lib, "_write_export", meanwhile)
  with pytest.raises(FileExistsError, match="written by another export while this one ran"):
    export_checkpoint(c, a, str(d), special_ids=SPECIAL, overwrite=False)
  assert tree_equal(import_checkpoint(str(d))[1], b)
  assert sorted(os.listdir(tmp_path)) == ["e"]


def test_export_workdir_keeps_overwrite_false_to_the_end(tmp_path, monkeypatch):
  """launch/export.py checks --out before the restore; a folder filled during the restore is
  refused too (it used to be overwritten: export_checkpoint's default overwrite=True)."""
  from setdiff_jax.workdir import load as workdir_lib

  c, (p,) = exports(seeds=(1,))
  out = tmp_path / "e"

  def restore(workdir, step=None, use_ema=True):
    out.mkdir()
    (out / "config.json").write_text('{"someone": "else"}')
    return workdir_lib.InferenceState(c, None, None, p, Tok(), 5)

  monkeypatch.setattr(workdir_lib, "load_inference_state", restore)
  with pytest.raises(FileExistsError, match=r"is not empty; .* overwrite=True \(--overwrite\)"):
    export_workdir(str(tmp_path / "run"), str(out))
  assert os.listdir(out) == ["config.json"]


def test_weights_of_another_export_are_refused_at_import(tmp_path):
  c, (a, b) = exports()
  d1, d2 = str(tmp_path / "a"), str(tmp_path / "b")
  export_checkpoint(c, a, d1, special_ids=SPECIAL)
  export_checkpoint(c, b, d2, special_ids=SPECIAL)
  weights = weight_files.SAFETENSORS_FILE
  shutil.copy(os.path.join(d2, weights), os.path.join(d1, weights))
  with pytest.raises(ValueError, match="come from two different exports .* export it again"):
    import_checkpoint(d1)
  # Written again by another tool (HF save_pretrained keeps only "format"): imported as before.
  save_file(load_file(os.path.join(d2, weights)), os.path.join(d1, weights), {"format": "pt"})
  assert tree_equal(import_checkpoint(d1)[1], b)


def test_a_bin_of_another_export_is_refused_at_import(tmp_path):
  """A pytorch_model.bin has no header for the export id: the import recomputes it from the
  tensors it reads (probe 16a: another step's .bin, even another method's, imported silently)."""
  pytest.importorskip("torch")
  c, (a, b) = exports()
  ar = run_config(objective="ar")
  d1, d2, d3 = (str(tmp_path / n) for n in ("a", "b", "ar"))
  export_checkpoint(c, a, d1, special_ids=SPECIAL, fmt="bin")
  export_checkpoint(c, b, d2, special_ids=SPECIAL, fmt="bin")
  export_checkpoint(ar, a, d3, special_ids=SPECIAL, fmt="bin")
  for d, params in ((d1, a), (d2, b), (d3, a)):  # genuine .bin exports import
    assert tree_equal(import_checkpoint(d)[1], params)
  weights = weight_files.BIN_FILE
  for src, dst in ((d2, d1), (d2, d3)):  # another step's weights; a SetDLM .bin under an AR export
    shutil.copy(os.path.join(src, weights), os.path.join(dst, weights))
    ids = [export_id(x) for x in (src, dst)]  # the weights', config.json's
    with pytest.raises(ValueError) as e:
      import_checkpoint(dst)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{dst}: its pytorch_model.bin and config")
    assert f"two different exports (export ids {ids[0]} and {ids[1]})" in message
    assert "export it again (--overwrite). Weights you changed on purpose" in message
  # Edited on purpose (a .bin is recomputed, so any edit differs): the way out the message names
  torch = pytest.importorskip("torch")
  bin_path = os.path.join(d1, weights)
  edited = torch.load(bin_path)
  edited = {k: v if k.endswith("inv_freq") else v + 1.0 for k, v in edited.items()}  # not RoPE's
  torch.save(edited, bin_path)
  with pytest.raises(ValueError, match='delete config.json\'s "setdiff_jax": {"export_id"} entry'):
    import_checkpoint(d1)
  cfg_path = os.path.join(d1, weight_files.CONFIG_FILE)
  cfg = weight_files.read_json(cfg_path)
  del cfg["setdiff_jax"]["export_id"]
  weight_files.write_json(cfg, cfg_path)
  imported = import_checkpoint(d1)[1]
  assert tree_equal(imported, jax.tree_util.tree_map(lambda x: x + 1.0, b))


def export_id(folder):
  """The export id (8 digits, as the message names it) in `folder`'s config.json."""
  cfg = weight_files.read_json(os.path.join(folder, weight_files.CONFIG_FILE))
  return cfg["setdiff_jax"]["export_id"][:8]


def test_overwrite_replaces_every_file_of_the_old_export_and_keeps_the_users(tmp_path):
  """The finding: an export without a tokenizer over one with a tokenizer kept the old tokenizer
  files, which the import then handed out as this export's; the user's 0600 file became 0644."""
  c, (old, new) = exports()
  d = tmp_path / "e"
  export_checkpoint(c, old, str(d), tokenizer=Tok())
  notes = d / "notes.txt"
  notes.write_text("mine")
  os.chmod(notes, 0o600)
  export_checkpoint(c, new, str(d), special_ids=SPECIAL)
  assert sorted(os.listdir(d)) == [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "notes.txt",
  ]
  assert stat.S_IMODE(os.stat(notes).st_mode) == 0o600
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(os.stat(d / "model.safetensors").st_mode) == 0o666 & ~umask
  config, params = import_checkpoint(str(d))
  assert config.interop.tokenizer_dir is None and tree_equal(params, new)


def test_a_safetensors_changed_in_place_is_refused_at_import(tmp_path):
  """One flipped bit in the tensor bytes of a model.safetensors (a damaged disk or copy) imported
  as the export's weights: its header's export id still agreed with config.json. The import
  recomputes the id from the tensors it read."""
  c, (a,) = exports(seeds=(1,))
  d = str(tmp_path / "e")
  export_checkpoint(c, a, d, special_ids=SPECIAL)
  file = os.path.join(d, weight_files.SAFETENSORS_FILE)
  flip_tensor_bit(file)
  want = export_id(d)
  with pytest.raises(ValueError) as e:
    import_checkpoint(d)
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"{d}: the tensors of its model.safetensors")
  assert "changed since the export (they digest to " in message
  assert f"the export id its header and config.json name is {want})" in message
  assert "export it again (--overwrite) or copy it again" in message
