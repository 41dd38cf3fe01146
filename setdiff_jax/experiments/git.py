"""The git questions a result record asks of its checkout: which commit, is the tree clean, is the
commit on main's history, and has the measured code changed since. Every call runs `git -C repo`."""

from __future__ import annotations

import subprocess
from typing import List, Optional, Sequence


class GitError(RuntimeError):
  """git could not answer (no repository, no git, a bad revision)."""


def _git(repo: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
  try:
    out = subprocess.run(
      ["git", "-C", repo, *args], capture_output=True, text=True, timeout=60, check=False
    )
  except (OSError, subprocess.SubprocessError) as e:
    raise GitError(f"git {' '.join(args)} failed in {repo}: {e}") from e
  if check and out.returncode != 0:
    raise GitError(f"git {' '.join(args)} failed in {repo}: {out.stderr.strip()}")
  return out


def top_level(path: str) -> str:
  """The repository root that holds `path`."""
  return _git(path, "rev-parse", "--show-toplevel").stdout.strip()


def head(repo: str) -> str:
  """HEAD's full commit hash."""
  return _git(repo, "rev-parse", "HEAD").stdout.strip()


def resolve(repo: str, rev: str) -> Optional[str]:
  """The full hash of `rev`, None if the repository has no such commit."""
  out = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
  return out.stdout.strip() if out.returncode == 0 else None


def dirty(repo: str, exclude: Sequence[str] = ()) -> List[str]:
  """Changed, staged or untracked (not ignored) paths, except those under `exclude` (paths
  relative to the repository root): what makes a tree unfit to record from."""
  spec = ["--", "."] + [f":(exclude){p}" for p in exclude]
  lines = _git(repo, "status", "--porcelain", *spec).stdout.splitlines()
  return [line[3:] for line in lines if line.strip()]


def is_ancestor(repo: str, commit: str, ref: str) -> bool:
  """Whether `commit` is on `ref`'s history (`git merge-base --is-ancestor`)."""
  out = _git(repo, "merge-base", "--is-ancestor", commit, ref, check=False)
  if out.returncode not in (0, 1):
    raise GitError(f"git merge-base --is-ancestor {commit} {ref}: {out.stderr.strip()}")
  return out.returncode == 0


def first_change_after(repo: str, commit: str, paths: Sequence[str], ref: str = "HEAD"):
  """The first commit after `commit` on `ref` that touches any of `paths` (git pathspecs), as
  (short hash, date YYYY-MM-DD), or None when none does. The first change, not the last: once
  a record is stale this answer no longer moves with new commits."""
  out = _git(
    repo, "log", "--reverse", "--format=%h %cs", f"{commit}..{ref}", "--", *paths
  ).stdout.split("\n")[0]
  return tuple(out.split(" ", 1)) if out.strip() else None


def names_files(repo: str, commit: str, paths: Sequence[str]) -> bool:
  """Whether the pathspecs `paths` name any file of `commit`'s history (a misspelt path names
  none, so no later change could ever be found in it)."""
  out = _git(repo, "rev-list", "-1", commit, "--", *paths, check=False)
  return out.returncode == 0 and bool(out.stdout.strip())


def deleted(repo: str, folder: str) -> List[str]:
  """The files git tracks under `folder` (a path relative to the repository root) that are gone
  from the working tree (removed by hand, not with `git rm`), relative to the root."""
  out = _git(repo, "ls-files", "-z", "--deleted", "--", f":(literal){folder}").stdout
  return sorted(p for p in out.split("\0") if p)
