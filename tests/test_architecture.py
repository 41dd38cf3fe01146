"""The architecture's promises, checked on the source (DESIGN §1, §3; issues 10, 34).

* The method registry is the only place that tells methods apart: no module outside
  `setdiff_jax/methods/` compares a method name (==, in, a match / startswith, a `case`, a
  dispatch table keyed by names; the library, launch/ and benchmarks/ but the two drivers of
  the official code), and method-name literals appear only where the names and the
  official config.json values are defined (configs/ are not the library).
* A method is three pieces, each beside the layer that uses it: its objective
  (`setdiff_jax/objectives/`), its decoder (`setdiff_jax/decoders/`) and its export format
  (`setdiff_jax/interop/formats.py`); each layer imports only the piece it needs and nothing but
  the registry imports all three.
* The import graph of `setdiff_jax` has no cycle, and no function-level import exists to dodge
  one (an internal import inside a function whose module-level version would close a cycle).
* Inference never imports the training layer: sampling, evaluation, interop, decoding and
  workdir reach neither `setdiff_jax.train` / `train_step` nor optax; train/checkpointing import
  nothing from sampling/, evaluation/ or interop/.
"""

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

from setdiff_jax import decoders, methods, objectives
from setdiff_jax.interop import formats

PKG = pathlib.Path(__file__).resolve().parents[1] / "setdiff_jax"
# Where method names are defined: the registry and the objectives (each objective's `name`).
NAME_DEFINITIONS = ("setdiff_jax.methods", "setdiff_jax.objectives")
# (module, literal): data, not dispatch. Each must say why.
ALLOWED_LITERALS = {
  # ObjectiveConfig's default method (a dataclass default; the registry validates the name).
  ("setdiff_jax.diffusion.losses", "setdlm"),
  # The official config.json's `model_type` values and the patterns that read them back.
  ("setdiff_jax.interop.formats", "ar"),
  ("setdiff_jax.interop.formats", "mdlm"),
  ("setdiff_jax.interop.formats", "bd3lm"),
  ("setdiff_jax.interop.formats", "setdlm"),
}


def module_name(path: pathlib.Path, pkg: pathlib.Path = PKG) -> str:
  rel = path.relative_to(pkg.parent).with_suffix("")
  parts = list(rel.parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def find_modules(pkg: pathlib.Path) -> dict:
  return {module_name(p, pkg): p for p in sorted(pkg.rglob("*.py"))}


MODULES = find_modules(PKG)


def docstring_nodes(tree):
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        out.add(id(body[0].value))
  return out


def resolve(module: str, node, modules=None) -> list:
  """Internal modules an import node names (relative imports resolved; attributes dropped)."""
  modules = MODULES if modules is None else modules
  targets = []
  if isinstance(node, ast.Import):
    targets = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:
      pkg = module.split(".")
      pkg = pkg[: len(pkg) - node.level + (1 if modules[module].name == "__init__.py" else 0)]
      base = ".".join(pkg + ([base] if base else []))
    targets = [base] + [f"{base}.{a.name}" for a in node.names]
  out = []
  for t in targets:
    while t and t not in modules:
      t = t.rpartition(".")[0]
    if t and t.startswith("setdiff_jax"):
      out.append(t)
  return out


def imports(module: str, modules=None):
  """(module-level internal imports, [(function-level import target, line)], external roots)."""
  modules = MODULES if modules is None else modules
  tree = ast.parse(modules[module].read_text())
  top, nested, external = set(), [], set()

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        visit(child, True)
      elif isinstance(child, (ast.Import, ast.ImportFrom)):
        names = resolve(module, child, modules)
        if not in_function:
          top.update(names)
          roots = (
            [a.name for a in child.names]
            if isinstance(child, ast.Import)
            else [child.module or ""]
            if not child.level
            else []
          )
          external.update(r.split(".")[0] for r in roots if not r.startswith("setdiff_jax"))
        else:
          nested.extend((n, child.lineno) for n in names)
      else:
        visit(child, in_function)

  visit(tree, False)
  # Importing a.b.c runs a, a.b and a.b.c: the packages above a target are edges too, except the
  # importing module's own packages (already initialising when it runs).
  own = {module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)} | {module}

  def with_parents(names):
    out = set()
    for n in names:
      while n:
        out.add(n)
        n = n.rpartition(".")[0]
    return out - own

  return with_parents(top), [(n, l) for n, l in nested if n not in own], external


def import_graph(modules: dict) -> dict:
  return {m: imports(m, modules) for m in modules}


GRAPH = import_graph(MODULES)


def reachable(start: str, graph=None, include_nested: bool = False) -> set:
  """Modules `start` imports, directly or through others (function-level imports too if asked)."""
  graph = GRAPH if graph is None else graph
  seen, todo = set(), [start]
  while todo:
    m = todo.pop()
    edges = graph[m][0] | ({t for t, _ in graph[m][1]} if include_nested else set())
    for n in edges:
      if n not in seen:
        seen.add(n)
        todo.append(n)
  return seen


def in_package(module: str, packages) -> bool:
  return any(module == p or module.startswith(p + ".") for p in packages)


def method_literals(modules: dict) -> list:
  """`path:line: 'name'` for each method-name string outside the modules that define the names
  (docstrings and the ALLOWED_LITERALS excepted)."""
  names = set(methods.NAMES)
  found = []
  for module, path in modules.items():
    if in_package(module, NAME_DEFINITIONS):
      continue
    tree = ast.parse(path.read_text())
    docs = docstring_nodes(tree)
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in names
        and id(node) not in docs
        and (module, node.value) not in ALLOWED_LITERALS
      ):
        found.append(f"{path.name}:{node.lineno}: {node.value!r}")
  return found


def test_method_names_appear_only_where_they_are_defined():
  found = method_literals(MODULES)
  assert not found, "method names outside their definitions (ask the registry):\n" + "\n".join(
    found
  )


MATCH_CALLS = {"startswith", "endswith", "match", "fullmatch", "search"}


def named_methods(node) -> list:
  """The method names among `node`'s string constants (itself, or a tuple / list / set of them)."""
  names = set(methods.NAMES)
  elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
  return [
    e.value
    for e in elts
    if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names
  ]


def name_comparisons(source: str) -> list:
  """`line: 'name' (how)` for each comparison of something against a method-name literal:
  `==` / `!=` / `in` / `not in` (either side), a string match (`x.startswith("ar")`,
  `re.match("bd3lm", x)`), a `case "mdlm":` and a dispatch table keyed by names."""
  found = []
  for node in ast.walk(ast.parse(source)):
    hits = []
    if isinstance(node, ast.Compare):
      hits = [(n, "compare") for o in [node.left, *node.comparators] for n in named_methods(o)]
    elif isinstance(node, ast.Call):
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if called in MATCH_CALLS:
        args = [*node.args, *(k.value for k in node.keywords)]
        hits = [(n, called) for a in args for n in named_methods(a)]
    elif isinstance(node, ast.MatchValue):
      hits = [(n, "case") for n in named_methods(node.value)]
    elif isinstance(node, ast.Dict):
      hits = [(n, "dispatch table") for k in node.keys if k is not None for n in named_methods(k)]
    found += [f"{node.lineno}: {n!r} ({how})" for n, how in hits]
  return found


# The benchmarks that drive the official PyTorch code by its own names: there a method name
# selects the official code's model classes, noise schedule and sampler (its config), which no
# piece of ours describes. Every other benchmark asks the pieces.
OFFICIAL_DRIVERS = ("benchmarks/official.py", "benchmarks/official_checks.py")


def comparisons_outside_registry(root: pathlib.Path) -> list:
  """`path:line: 'name' (how)` for each method-name comparison under `root` outside
  setdiff_jax/methods/: the library, the launchers and the benchmarks (OFFICIAL_DRIVERS
  excepted)."""
  pkg = root / "setdiff_jax"
  files = [p for m, p in find_modules(pkg).items() if not in_package(m, ("setdiff_jax.methods",))]
  files += sorted((root / "launch").glob("*.py"))
  files += [
    p
    for p in sorted((root / "benchmarks").glob("*.py"))
    if p.relative_to(root).as_posix() not in OFFICIAL_DRIVERS
  ]
  return [
    f"{path.relative_to(root).as_posix()}:{hit}"
    for path in files
    for hit in name_comparisons(path.read_text())
  ]


def test_no_module_outside_the_registry_compares_method_names():
  """What differs between methods is asked of the registry's pieces: the library and the
  launchers without exception, the benchmarks but the drivers of the official code."""
  found = comparisons_outside_registry(PKG.parent)
  assert not found, "method-name comparisons outside setdiff_jax/methods/:\n" + "\n".join(found)


def test_official_drivers_exist():
  """The allow-list names real modules (a renamed driver must not leave a stale exception)."""
  assert all((PKG.parent / path).is_file() for path in OFFICIAL_DRIVERS)


def test_comparison_check_covers_benchmarks_but_the_official_drivers(tmp_path):
  """A comparison planted in a benchmark is found, the same in an official driver is not, and
  one in the library or the registry's own package behaves as the check above says."""
  planted = 'def f(objective):\n  return objective == "bd3lm"\n'
  for rel in (
    "benchmarks/planted.py",
    "benchmarks/official.py",
    "launch/planted.py",
    "setdiff_jax/planted.py",
    "setdiff_jax/methods/planted.py",
  ):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text(planted)
  assert comparisons_outside_registry(tmp_path) == [
    "setdiff_jax/planted.py:2: 'bd3lm' (compare)",
    "launch/planted.py:2: 'bd3lm' (compare)",
    "benchmarks/planted.py:2: 'bd3lm' (compare)",
  ]


def test_comparison_check_can_fail():
  planted = (
    "import re\n"
    'NAME = "setdlm"  # a definition, not a comparison\n'
    "def f(objective, x):\n"
    '  """ar == x in a docstring"""\n'
    '  g(objective="ar")\n'
    '  if objective == "bd3lm" or "mdlm" != objective: pass\n'
    '  if objective in ("ar", "other"): pass\n'
    '  if x.startswith("ar") or re.match("setdlm", x): pass\n'
    "  match objective:\n"
    '    case "mdlm": pass\n'
    '  return {"bd3lm": 1}[objective]\n'
  )
  assert sorted(name_comparisons(planted)) == sorted(
    [
      "6: 'bd3lm' (compare)",
      "6: 'mdlm' (compare)",
      "7: 'ar' (compare)",
      "8: 'ar' (startswith)",
      "8: 'setdlm' (match)",
      "10: 'mdlm' (case)",
      "11: 'bd3lm' (dispatch table)",
    ]
  )


def test_literal_check_can_fail(tmp_path):
  """The check above, run on a planted module, finds the comparison (and not the docstring)."""
  pkg = tmp_path / "setdiff_jax"
  pkg.mkdir()
  (pkg / "planted.py").write_text(
    '"""bd3lm in a docstring is fine."""\ndef f(objective):\n  return objective == "bd3lm"\n'
  )
  assert method_literals(find_modules(pkg)) == ["planted.py:3: 'bd3lm'"]


# The layers of DESIGN §1, bottom to top. A module may import its own layer and the ones below;
# function-level imports count (a lazy import is still a dependency).
LAYERS = [
  (
    "base",
    (
      "setdiff_jax.errors",
      "setdiff_jax.paths",
      "setdiff_jax.layer_names",
      "setdiff_jax.config.fields",
    ),
  ),
  ("cli", ("setdiff_jax.cli", "setdiff_jax.cli_storage", "setdiff_jax.cli_signals")),
  ("data", ("setdiff_jax.data",)),
  ("models", ("setdiff_jax.models",)),
  ("diffusion", ("setdiff_jax.diffusion",)),
  ("objectives", ("setdiff_jax.objectives",)),
  ("sharding", ("setdiff_jax.sharding",)),
  ("config", ("setdiff_jax.config.sections", "setdiff_jax.config.run")),
  ("sampling", ("setdiff_jax.sampling",)),
  ("decoders", ("setdiff_jax.decoders",)),
  ("config edge", ("setdiff_jax.config.edge",)),
  ("workdir", ("setdiff_jax.workdir",)),
  ("trainer", ("setdiff_jax.trainer",)),
  ("decoding", ("setdiff_jax.decoding",)),
  ("uses", ("setdiff_jax.evaluation", "setdiff_jax.interop")),
  ("testing", ("setdiff_jax.testing",)),
  ("methods", ("setdiff_jax.methods",)),
  ("experiments", ("setdiff_jax.experiments",)),
  ("train", ("setdiff_jax.train", "setdiff_jax.train_step", "setdiff_jax.rl")),
]


def layer_of(module: str):
  """Index of the module's layer in LAYERS; the package's own __init__s (setdiff_jax, its config
  package, which imports nothing) are below everything."""
  if module in ("setdiff_jax", "setdiff_jax.config"):
    return -1
  for i, (_, prefixes) in enumerate(LAYERS):
    if any(module == p or module.startswith(p + ".") for p in prefixes):
      return i
  return None


def upward_imports(graph: dict) -> list:
  """`a -> b` for each module b that a reaches (transitively, function-level imports included)
  in a layer above a's."""
  bad = []
  for module in graph:
    for target in sorted(reachable(module, graph, include_nested=True)):
      if layer_of(target) is not None and layer_of(target) > layer_of(module):
        bad.append(
          f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        )
  return bad


def test_the_registry_binds_three_tables_of_the_same_methods():
  assert tuple(objectives.REGISTRY) == methods.NAMES
  assert sorted(decoders.REGISTRY) == sorted(formats.REGISTRY) == sorted(methods.NAMES)
  for name, entry in methods.REGISTRY.items():
    assert (entry.objective.name, entry.decoder.name, entry.export.name) == (name,) * 3
  with pytest.raises(ValueError, match=r"objective='nope'; expected one of \('setdlm'"):
    methods.get("nope")


def test_only_the_registry_imports_the_registry():
  """Each layer imports the piece of a method it needs, never the three together."""
  importers = [
    m for m in MODULES if "setdiff_jax.methods" in GRAPH[m][0] | {t for t, _ in GRAPH[m][1]}
  ]
  assert not [m for m in importers if not in_package(m, ("setdiff_jax.methods",))]


def test_no_library_module_imports_the_testing_package():
  """The references and parity checks serve the tests and `launch/export.py --verify` (which
  hands `testing.verify.export_report` to `interop.export.export_workdir`)."""
  bad = [
    m
    for m in MODULES
    if not in_package(m, ("setdiff_jax.testing",))
    and any(in_package(t, ("setdiff_jax.testing",)) for t in reachable(m, include_nested=True))
  ]
  assert not bad, bad


def pieces_reached(module: str) -> set:
  """Which pieces of a method (objective, decoder, export format) `module` reaches."""
  reach = reachable(module, include_nested=True) | {module}
  kinds = {
    "objective": ("setdiff_jax.objectives",),
    "decoder": ("setdiff_jax.decoders",),
    "export format": ("setdiff_jax.interop.formats",),
  }
  return {k for k, pkgs in kinds.items() if any(in_package(m, pkgs) for m in reach)}


@pytest.mark.parametrize(
  "prefix, allowed",
  [
    ("setdiff_jax.objectives", {"objective"}),  # a loss needs no sampler nor file format
    ("setdiff_jax.decoders", {"objective", "decoder"}),  # keyed by the objectives' names
    ("setdiff_jax.interop", {"objective", "export format"}),  # interop: not the decoder
    ("setdiff_jax.workdir", {"objective"}),  # the run's config: no decoding defaults
    ("setdiff_jax.train_step", {"objective"}),  # the training step: the loss only
    ("setdiff_jax.sampling", set()),  # samplers know no method
    ("setdiff_jax.diffusion", set()),  # the losses know no registry
  ],
)
def test_each_layer_reaches_only_the_pieces_it_needs(prefix, allowed):
  bad = {m: sorted(pieces_reached(m) - allowed) for m in MODULES if in_package(m, (prefix,))}
  bad = {m: p for m, p in bad.items() if p}
  assert not bad, f"modules reaching pieces of a method they do not need: {bad}"


def test_every_module_has_a_layer():
  assert not [m for m in MODULES if layer_of(m) is None]


def test_no_module_reaches_a_higher_layer():
  bad = upward_imports(GRAPH)
  assert not bad, "imports of a higher layer (DESIGN §1):\n" + "\n".join(bad)


def test_layer_check_finds_a_planted_transitive_upward_import(tmp_path):
  """A copy of the package with one function-level import planted in a base-layer module: the
  check names it and the modules of other layers that reach the plant through it."""
  pkg = tmp_path / "setdiff_jax"
  shutil.copytree(
    PKG, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.xz", "*.txt", "*.json")
  )
  assert not upward_imports(import_graph(find_modules(pkg)))
  target = pkg / "layer_names.py"
  target.write_text(
    target.read_text() + "\n\ndef _planted():\n"
    "  from setdiff_jax.sampling import cache  # noqa: F401\n"
  )
  bad = upward_imports(import_graph(find_modules(pkg)))
  assert "setdiff_jax.layer_names (base) -> setdiff_jax.sampling.cache (sampling)" in bad
  # sharding imports layer_names at module level: it now reaches the sampling layer through it
  assert any(b.startswith("setdiff_jax.sharding (sharding) -> setdiff_jax.sampling") for b in bad)


@pytest.mark.parametrize(
  "module", sorted(m for m in MODULES if m.startswith("setdiff_jax.workdir"))
)
def test_workdir_reaches_neither_methods_nor_sampling(module):
  """The run-directory layer (lock, checkpoints, fallback, load, the run's tokenizer) reads the
  typed config below the method registry and the samplers: it reaches neither, even through
  another module or a function-level import (issue 34)."""
  reach = reachable(module, include_nested=True)
  bad = sorted(m for m in reach if m.startswith(("setdiff_jax.methods", "setdiff_jax.sampling")))
  assert not bad, f"{module} reaches {bad}"


def test_workdir_check_can_fail():
  """The check above finds a planted function-level import of the registry, two modules away."""
  graph = dict(GRAPH)
  top, nested, ext = graph["setdiff_jax.config.run"]
  graph["setdiff_jax.config.run"] = (top, nested + [("setdiff_jax.methods", 1)], ext)
  assert "setdiff_jax.methods" in reachable("setdiff_jax.workdir.load", graph, include_nested=True)


def test_import_graph_has_no_cycle():
  for module in MODULES:
    assert module not in reachable(module), f"import cycle through {module}"


def test_no_function_level_import_dodges_a_cycle():
  dodges = []
  for module in MODULES:
    for target, line in GRAPH[module][1]:
      if module in reachable(target) | {target}:
        dodges.append(
          f"{module}:{line} imports {target} inside a function: at module level it "
          f"would close a cycle"
        )
  assert not dodges, "\n".join(dodges)


INFERENCE = [
  m
  for m in MODULES
  if m.startswith(("setdiff_jax.sampling", "setdiff_jax.evaluation", "setdiff_jax.interop"))
]
INFERENCE += [
  "setdiff_jax.decoding",
  "setdiff_jax.workdir.load",
  "setdiff_jax.evaluation.likelihood",
  "setdiff_jax.objectives",
  "setdiff_jax.decoders",
  "setdiff_jax.methods",
]


@pytest.mark.parametrize("module", INFERENCE)
def test_inference_never_reaches_the_training_layer(module):
  reach = reachable(module) | {module}
  assert not reach & {"setdiff_jax.train", "setdiff_jax.train_step"}
  externals = set().union(*(GRAPH[m][2] for m in reach))
  assert "optax" not in externals, f"{module} reaches optax"


@pytest.mark.parametrize(
  "module",
  ["setdiff_jax.workdir.checkpoints", "setdiff_jax.workdir.fallback", "setdiff_jax.workdir.lock"],
)
def test_checkpoint_code_reaches_no_method_or_inference_code(module):
  """Saving and guarding a run is plumbing: it reaches no method, sampler, evaluator or exporter,
  even through another module."""
  reach = reachable(module, include_nested=True)
  bad = sorted(
    m
    for m in reach
    if m.startswith(
      (
        "setdiff_jax.sampling",
        "setdiff_jax.evaluation",
        "setdiff_jax.interop",
        "setdiff_jax.methods",
        "setdiff_jax.objectives",
        "setdiff_jax.decoders",
      )
    )
  )
  assert not bad, f"{module} reaches {bad}"


def test_inference_imports_load_neither_optax_nor_train():
  """The same promise, at run time: importing the inference stack loads no training code."""
  code = (
    "import sys; import setdiff_jax.decoding, setdiff_jax.evaluation, "
    "setdiff_jax.interop.export, setdiff_jax.workdir.load; "
    "bad = [m for m in ('optax', 'setdiff_jax.train', 'setdiff_jax.train_step') "
    "if m in sys.modules]; "
    "sys.exit(f'loaded {bad}' if bad else 0)"
  )
  res = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(PKG.parent)
  )
  assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-500:]


def configs_imports(modules: dict) -> list:
  """`module:line` for each import of the repository's configs/ package (at any depth)."""
  found = []
  for module, path in modules.items():
    for node in ast.walk(ast.parse(path.read_text())):
      roots = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [node.module or ""]
        if isinstance(node, ast.ImportFrom) and not node.level
        else []
      )
      if any(r.split(".")[0] == "configs" for r in roots):
        found.append(f"{module}:{node.lineno}")
  return found


def test_no_library_module_imports_configs():
  """Defaults belong in the package: the library never imports configs/."""
  assert not configs_imports(MODULES)


def test_configs_check_can_fail(tmp_path):
  pkg = tmp_path / "setdiff_jax"
  pkg.mkdir()
  (pkg / "planted.py").write_text(
    "import os\n\ndef f():\n  from configs import default\n  import configs.tiny_sw\n"
  )
  assert configs_imports(find_modules(pkg)) == ["setdiff_jax.planted:4", "setdiff_jax.planted:5"]


def test_no_library_module_over_500_lines():
  long = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
  assert all(n <= 500 for n in long.values()), {m: n for m, n in long.items() if n > 500}
