"""Packaging: extras pip 23.2 finds under the README's names, package data that covers the
packaged vocabularies. (The wheel itself is built and used by .ci/wheel_check.sh.)"""

import ast
import fnmatch
import pathlib
import re

from setdiff_jax.data import tokenizers

REPO = pathlib.Path(__file__).resolve().parents[1]


def _setup_kwargs() -> dict:
  """The literal keyword arguments of setup() in setup.py (read, not run)."""
  tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
  call = next(
    n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup"
  )
  out = {}
  for kw in call.keywords:
    try:
      out[kw.arg] = ast.literal_eval(kw.value)
    except ValueError:
      pass  # computed values (long_description, packages, ...)
  return out


def _normalised(name: str) -> str:
  # PEP 685 / the metadata setuptools writes (Provides-Extra).
  return re.sub(r"[-_.]+", "-", name).lower()


def test_extra_names_are_normalised_and_cover_the_readme():
  """pip 23.2 compares `.[name]` with the metadata's normalised names without normalising the
  request: an extra `lm_eval` (metadata `lm-eval`) installed nothing under `.[lm_eval]`."""
  extras = _setup_kwargs()["extras_require"]
  assert set(extras) >= {"torch", "test", "lmeval", "tensorboard"}
  for name in extras:
    assert _normalised(name) == name, f"extra {name!r} is {_normalised(name)!r} in the metadata"
  readme = (REPO / "README.md").read_text(encoding="utf-8")
  named = {
    e.strip()
    for group in re.findall(r'pip install -e "\.\[([^\]]+)\]"', readme)
    for e in group.split(",")
  }
  assert "lmeval" in named and named <= set(extras), named - set(extras)


def test_package_data_holds_the_vocabularies_and_licences():
  patterns = _setup_kwargs()["package_data"]["setdiff_jax.data"]
  data_dir = REPO / "setdiff_jax" / "data"
  shipped = {
    str(p.relative_to(data_dir))
    for p in (data_dir / "vocab").rglob("*")
    if p.is_file()
    if any(fnmatch.fnmatch(str(p.relative_to(data_dir)), pat) for pat in patterns)
  }
  wanted = {f"vocab/{n}" for n in tokenizers.PACKAGED_VOCABS}
  wanted |= {"vocab/README.md", "vocab/bert-base-uncased/LICENSE", "vocab/gpt2/LICENSE"}
  assert wanted <= shipped, wanted - shipped
