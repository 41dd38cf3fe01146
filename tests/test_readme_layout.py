"""README's layout section names every module of the package, and only modules that exist.

The section holds a tree in a fenced code block: `name/` opens a package (two spaces of indent per
level), `name.py` is a module, the rest of a line is its job. A module added without a README line,
or a line left behind by a move, fails here.
"""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "setdiff_jax"
# Modules other branches are adding while this test lands; listed in README ahead of the files.
# Allowed to be absent (never to be unlisted); drop an entry once its file is on main.
PENDING = set()


def layout_tree(readme: str):
  """The first fenced block of README's `## Layout` section, as its lines."""
  section = re.search(r"^## Layout\n(.*?)(?=^## )", readme, re.S | re.M)
  assert section, "README.md has no `## Layout` section"
  block = re.search(r"^```\n(.*?)^```", section.group(1), re.S | re.M)
  assert block, "README's layout section has no fenced tree"
  return block.group(1).splitlines()


def tree_entries(lines):
  """{path: job} of the .py entries of a layout tree, paths relative to the repo root.

  Each line is `<2k spaces><name> <job>`; a name ending in `/` opens a folder at depth k + 1."""
  folders, entries = [], {}
  for n, line in enumerate(lines, 1):
    m = re.match(r"^( *)(\S+)(?:\s+(.*))?$", line)
    if not m:
      continue
    indent, name, job = len(m.group(1)), m.group(2), (m.group(3) or "").strip()
    if indent % 2:
      raise ValueError(f"line {n}: odd indent {indent}: {line!r}")
    depth = indent // 2
    if depth > len(folders):
      raise ValueError(f"line {n}: indented below no folder: {line!r}")
    del folders[depth:]
    if name.endswith("/"):
      folders.append(name.rstrip("/"))
    elif name.endswith(".py"):
      path = "/".join(folders + [name])
      if path in entries:
        raise ValueError(f"line {n}: {path} listed twice")
      entries[path] = job
  return entries


def package_modules(root: pathlib.Path):
  return {p.relative_to(root).as_posix() for p in (root / PACKAGE).rglob("*.py")}


def layout_problems(readme: str, modules):
  """What is wrong between README's tree and the package's module files (empty: nothing)."""
  listed = tree_entries(layout_tree(readme))
  problems = [f"{m} is not named in README's layout section" for m in sorted(modules - set(listed))]
  problems += [
    f"README's layout names {p}, which does not exist"
    for p in sorted(set(listed) - modules - PENDING)
  ]
  problems += [f"README's layout gives {p} no job" for p, job in sorted(listed.items()) if not job]
  return problems


def test_readme_layout_matches_the_package():
  readme = (REPO / "README.md").read_text()
  modules = package_modules(REPO)
  assert len(modules) > 50  # the walk found the package
  assert layout_problems(readme, modules) == []


TREE = """\
## Layout

```
setdiff_jax/
  errors.py     bad input
  models/       backbones
    dit.py      the DiT
  train.py      the loop
```

## Next
"""


def test_parser_reads_nesting():
  assert tree_entries(layout_tree(TREE)) == {
    "setdiff_jax/errors.py": "bad input",
    "setdiff_jax/models/dit.py": "the DiT",
    "setdiff_jax/train.py": "the loop",
  }


@pytest.mark.parametrize(
  "modules,expected",
  [
    ({"setdiff_jax/errors.py", "setdiff_jax/models/dit.py", "setdiff_jax/train.py"}, []),
    # a new module without a README line
    (
      {
        "setdiff_jax/errors.py",
        "setdiff_jax/models/dit.py",
        "setdiff_jax/train.py",
        "setdiff_jax/models/layers.py",
      },
      ["setdiff_jax/models/layers.py is not named in README's layout section"],
    ),
    # a line left behind by a move
    (
      {"setdiff_jax/errors.py", "setdiff_jax/train.py"},
      ["README's layout names setdiff_jax/models/dit.py, which does not exist"],
    ),
  ],
)
def test_layout_check_can_fail(modules, expected):
  assert layout_problems(TREE, modules) == expected


def test_a_job_is_required():
  assert layout_problems(
    TREE.replace("the loop", ""),
    {"setdiff_jax/errors.py", "setdiff_jax/models/dit.py", "setdiff_jax/train.py"},
  ) == ["README's layout gives setdiff_jax/train.py no job"]
