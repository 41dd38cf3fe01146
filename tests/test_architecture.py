"""The architecture's promises, checked on the source (DESIGN §1, §3; issue 10).

  * The method registry is the only place that tells methods apart: no method-name literal in the
    library outside `setdiff_jax/methods/` (configs/ are not the library).
  * The import graph of `setdiff_jax` has no cycle, and no function-level import exists to dodge
    one (an internal import inside a function whose module-level version would close a cycle).
  * Inference never imports the training layer: sampling, evaluation, interop, decoding and
    workdir reach neither `setdiff_jax.train` nor optax; train/checkpointing import nothing from
    sampling/, evaluation/ or interop/.
"""
import ast
import pathlib
import subprocess
import sys

import pytest

from setdiff_jax import methods

PKG = pathlib.Path(__file__).resolve().parents[1] / "setdiff_jax"
# (module, literal): data defaults, not dispatch. Each must say why.
ALLOWED_LITERALS = {
    # ObjectiveConfig's default method (a dataclass default; the registry validates the name).
    ("setdiff_jax.diffusion.losses", "setdlm"),
}


def module_name(path: pathlib.Path) -> str:
  rel = path.relative_to(PKG.parent).with_suffix("")
  parts = list(rel.parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def docstring_nodes(tree):
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        out.add(id(body[0].value))
  return out


def resolve(module: str, node) -> list:
  """Internal modules an import node names (relative imports resolved; attributes dropped)."""
  targets = []
  if isinstance(node, ast.Import):
    targets = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:
      pkg = module.split(".")
      pkg = pkg[:len(pkg) - node.level + (1 if MODULES[module].name == "__init__.py" else 0)]
      base = ".".join(pkg + ([base] if base else []))
    targets = [base] + [f"{base}.{a.name}" for a in node.names]
  out = []
  for t in targets:
    while t and t not in MODULES:
      t = t.rpartition(".")[0]
    if t and t.startswith("setdiff_jax"):
      out.append(t)
  return out


def imports(module: str):
  """(module-level internal imports, [(function-level import target, line)], external roots)."""
  tree = ast.parse(MODULES[module].read_text())
  top, nested, external = set(), [], set()
  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        visit(child, True)
      elif isinstance(child, (ast.Import, ast.ImportFrom)):
        names = resolve(module, child)
        if not in_function:
          top.update(names)
          roots = ([a.name for a in child.names] if isinstance(child, ast.Import)
                   else [child.module or ""] if not child.level else [])
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


GRAPH = {m: imports(m) for m in MODULES}


def reachable(start: str) -> set:
  seen, todo = set(), [start]
  while todo:
    m = todo.pop()
    for n in GRAPH[m][0]:
      if n not in seen:
        seen.add(n)
        todo.append(n)
  return seen


def test_method_names_appear_only_in_the_registry():
  names = set(methods.NAMES)
  found = []
  for module, path in MODULES.items():
    if module.startswith("setdiff_jax.methods"):
      continue
    tree = ast.parse(path.read_text())
    docs = docstring_nodes(tree)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
          and id(node) not in docs and (module, node.value) not in ALLOWED_LITERALS):
        found.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
  assert not found, "method names outside setdiff_jax/methods/ (ask the registry):\n" + "\n".join(found)


def test_literal_check_can_fail(tmp_path):
  """The check above sees a comparison on a method name (a guard against a vacuous AST walk)."""
  tree = ast.parse('if objective == "bd3lm":\n  pass\n')
  hits = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in methods.NAMES]
  assert len(hits) == 1


def test_import_graph_has_no_cycle():
  for module in MODULES:
    assert module not in reachable(module), f"import cycle through {module}"


def test_no_function_level_import_dodges_a_cycle():
  dodges = []
  for module in MODULES:
    for target, line in GRAPH[module][1]:
      if module in reachable(target) | {target}:
        dodges.append(f"{module}:{line} imports {target} inside a function: at module level it "
                      f"would close a cycle")
  assert not dodges, "\n".join(dodges)


INFERENCE = [m for m in MODULES if m.startswith(("setdiff_jax.sampling", "setdiff_jax.evaluation",
                                                 "setdiff_jax.interop"))]
INFERENCE += ["setdiff_jax.decoding", "setdiff_jax.workdir.load", "setdiff_jax.evaluation.likelihood",
              "setdiff_jax.methods"]


@pytest.mark.parametrize("module", INFERENCE)
def test_inference_never_reaches_the_training_layer(module):
  reach = reachable(module) | {module}
  assert "setdiff_jax.train" not in reach
  externals = set().union(*(GRAPH[m][2] for m in reach))
  assert "optax" not in externals, f"{module} reaches optax"


def test_training_imports_no_inference_package():
  for module in ("setdiff_jax.train", "setdiff_jax.workdir.checkpoints"):
    direct = GRAPH[module][0] | {t for t, _ in GRAPH[module][1]}
    bad = [m for m in direct if m.startswith(("setdiff_jax.sampling", "setdiff_jax.evaluation",
                                              "setdiff_jax.interop"))
           and m not in ("setdiff_jax.evaluation", "setdiff_jax.evaluation.likelihood",
                         "setdiff_jax.interop", "setdiff_jax.interop.pretrained")]
    assert not bad, f"{module} imports {bad}"


def test_inference_imports_load_neither_optax_nor_train():
  """The same promise, at run time: importing the inference stack loads no training code."""
  code = ("import sys; import setdiff_jax.decoding, setdiff_jax.evaluation, "
          "setdiff_jax.interop.export, setdiff_jax.workdir.load; "
          "bad = [m for m in ('optax', 'setdiff_jax.train') if m in sys.modules]; "
          "sys.exit(f'loaded {bad}' if bad else 0)")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=str(PKG.parent))
  assert res.returncode == 0, res.stderr[-2000:] + res.stdout[-500:]


def test_no_library_module_imports_configs():
  for module in MODULES:
    direct = {t for t, _ in GRAPH[module][1]}
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "configs":
        pytest.fail(f"{module}:{node.lineno} imports configs/ (defaults belong in the package)")
      if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "configs" for a in node.names):
        pytest.fail(f"{module}:{node.lineno} imports configs/")
    del direct


def test_no_library_module_over_500_lines():
  long = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
  assert all(n <= 500 for n in long.values()), {m: n for m, n in long.items() if n > 500}
