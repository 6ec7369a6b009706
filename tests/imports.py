#!/usr/bin/env python3
"""Import circles in a crate's modules: between top-level modules (`crate::a` using `crate::b`
and back) and between the files of one folder (`super::x`, `crate::a::x`). Prints each circle and
exits 1 if there is one; `--map` prints the order of the top-level modules instead.

Usage: tests/imports.py [daemon/src ...]
"""
import re
import sys
from pathlib import Path

USE = re.compile(r"\b(crate|super|self)((?:::[a-z_][a-z0-9_]*)+)")


def module_path(root: Path, f: Path) -> list[str]:
    parts = list(f.relative_to(root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


USE_STMT = re.compile(r"\buse\s+([^;]+);")


def expand_use(tree: str) -> list[str]:
    """The paths of one `use` tree: `super::{a, b::{c, D}}` -> super::a, super::b::c, super::b::D."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    depth, j = 0, i
    for j in range(i, len(tree)):
        depth += {"{": 1, "}": -1}.get(tree[j], 0)
        if depth == 0:
            break
    items, depth, start = [], 0, i + 1
    for k in range(i + 1, j):
        depth += {"{": 1, "}": -1}.get(tree[k], 0)
        if tree[k] == "," and depth == 0:
            items.append(tree[start:k])
            start = k + 1
    items.append(tree[start:j])
    return [p for item in items if item for p in expand_use(tree[:i] + item + tree[j + 1:])]


def with_uses_expanded(text: str) -> str:
    """`text` with every grouped `use` written out path by path (USE does not read braces)."""
    return USE_STMT.sub(lambda m: ";".join(f"use {p}" for p in expand_use(m.group(1))) + ";", text)


def strip_comments(text: str) -> str:
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def edges(root: Path):
    """(from module path, to module path) for every crate/super path in the source, tests and
    `#[cfg(test)]` modules excluded."""
    files = [f for f in root.rglob("*.rs") if "tests" not in f.relative_to(root).parts[:-1]
             and f.name != "tests.rs"]
    mods = {tuple(module_path(root, f)) for f in files}
    out = []
    for f in files:
        here = module_path(root, f)
        is_mod_file = f.name in ("mod.rs", "lib.rs", "main.rs") or (f.with_suffix("").is_dir())
        text = with_uses_expanded(strip_comments(f.read_text()))
        text = text.split("#[cfg(test)]\nmod tests", 1)[0]
        for m in USE.finditer(text):
            kind, rest = m.group(1), m.group(2).split("::")[1:]
            if kind == "crate":
                target = rest
            else:
                # `super` from a file module is its parent; from a folder's root file, the parent
                # of the folder (`self` is the module itself).
                base = list(here) if is_mod_file else list(here[:-1])
                if kind == "super":
                    base = base[:-1] if is_mod_file else base
                    while rest and rest[0] == "super":
                        base, rest = base[:-1], rest[1:]
                else:
                    base = list(here)
                target = base + rest
            # The longest prefix that is a module of the crate.
            while target and tuple(target) not in mods:
                target = target[:-1]
            if target and target != here:
                out.append((tuple(here), tuple(target)))
    return out


def circles(graph: dict) -> list[list]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, res, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return res


def check(root: Path) -> list[str]:
    e = edges(root)
    problems = []
    # Between top-level modules (folders count as one).
    top = {}
    for a, b in e:
        if a and b and a[0] != b[0]:
            top.setdefault(a[0], set()).add(b[0])
    for c in circles(top):
        problems.append(f"{root}: top-level modules import each other: {' <-> '.join(c)}")
    # Inside a folder: between its direct children.
    inner = {}
    for a, b in e:
        n = 1
        while len(a) > n and len(b) > n and a[:n] == b[:n]:
            if a[n] != b[n]:
                inner.setdefault(a[:n], {}).setdefault(a[n], set()).add(b[n])
            n += 1
    for folder, g in sorted(inner.items()):
        for c in circles(g):
            problems.append(f"{root}: inside {'::'.join(folder)}: {' <-> '.join(c)}")
    return problems


def main() -> int:
    roots = [Path(a) for a in sys.argv[1:] if not a.startswith("--")] or [Path("daemon/src")]
    problems = [p for r in roots for p in check(r)]
    for p in problems:
        print(p)
    if not problems:
        print("no import circles in", ", ".join(map(str, roots)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
