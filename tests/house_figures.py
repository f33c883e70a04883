"""The shape of a Python package in figures: rooms, floors, circles, the largest module, and how far
one entry point's parsed options travel through the code (stops, climbs, returns).

Run it on a package folder (tools-free, the standard library only):

    python3 tests/house_figures.py integration/nemo_rl_gtp/harness --entry cli.stage_main

How each figure is counted:
- rooms: the package's sub-packages, plus one for the modules at its top level (a flat package is
  one room);
- floors: the levels of the import graph made by the imports at module level (what Python runs at
  import time): a module that imports nothing of the package is floor 0, any other is one above the
  highest it imports; floors is the number of levels, of the rooms' graph (room_floors: a room's
  imports are its modules', those inside functions included, as the rooms' table checks them; an
  import inside a room does not count) and of the modules' graph (module_floors);
- circles: the import cycles (strongly connected groups of two or more modules) of the whole import
  graph, imports inside functions included;
- the walk: from the entry function, the value ``parse_args`` returns is followed (a single pass,
  statement by statement): a name assigned from an expression that uses a followed name is
  followed; a call into a function of the package with a followed argument (or receiver) enters it
  with the matching parameters followed. Each function entered is a stop (each call site once; a
  function already on the way down is not entered again); a stop whose module is on a higher floor
  than its caller's is a climb; a stop whose function hands a value back (``return X``) is a return,
  and what it hands back is followed in the caller. A stop in another module than its caller's is a
  crossing (the walk's back and forth between modules), and one in another room a room crossing.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Module:
    name: str                      # dotted, relative to the package ("" for its __init__)
    path: Path
    tree: ast.Module
    is_pkg: bool
    top_imports: set[str] = field(default_factory=set)    # package modules imported at module level
    all_imports: set[str] = field(default_factory=set)    # ... anywhere in the file
    aliases: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local name -> (module, attr)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)       # qualname -> def
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def load(pkg: Path) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for path in sorted(pkg.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(pkg).with_suffix("").parts
        is_pkg = rel[-1] == "__init__"
        name = ".".join(rel[:-1] if is_pkg else rel)
        mods[name] = Module(name, path, ast.parse(path.read_text()), is_pkg)
    for m in mods.values():
        _index(m, mods)
    return mods


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _index(m: Module, mods: dict[str, Module]) -> None:
    here = m.name.split(".") if m.name else []
    pkg = here if m.is_pkg else here[:-1]
    top_level = {id(n) for n in m.tree.body}
    for stmt in m.tree.body:   # imports under a module-level try/if run at import time too
        if isinstance(stmt, (ast.Try, ast.If)):
            top_level |= {id(n) for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(m.tree):
        found: list[tuple[str, str, str | None]] = []   # (local name, module, attribute)
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _join(*pkg[: len(pkg) - (node.level - 1)], node.module or "")
            else:   # a script's fallback: `import fixtures` beside it
                base = _join(*pkg, node.module or "") if _join(*pkg, node.module or "") in mods else None
                if base is None:
                    continue
            for a in node.names:
                sub = _join(base, a.name)
                found.append((a.asname or a.name, sub, None) if sub in mods else (a.asname or a.name, base, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                sub = _join(*pkg, a.name)
                if sub in mods:
                    found.append((a.asname or a.name.split(".")[0], sub, None))
        for local, mod, attr in found:
            if mod not in mods:
                continue
            m.aliases.setdefault(local, (mod, attr))
            if mod != m.name:
                m.all_imports.add(mod)
                if id(node) in top_level:
                    m.top_imports.add(mod)
    for stmt in m.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            m.functions[stmt.name] = stmt
        elif isinstance(stmt, ast.ClassDef):
            m.classes[stmt.name] = stmt
            for sub in stmt.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    m.functions[f"{stmt.name}.{sub.name}"] = sub


def room_of(module: str) -> str:
    """A sub-package's name, or "" for the modules at the package's top level."""
    return module.split(".")[0] if "." in module else ""


def room_floors(mods: dict[str, Module]) -> dict[str, int]:
    edges: dict[str, set[str]] = {}
    for m in mods.values():
        mine = room_of(m.name) if not (m.is_pkg and m.name) else m.name
        edges.setdefault(mine, set())
        for t in m.all_imports:
            theirs = room_of(t) if not (mods[t].is_pkg and t) else t
            if theirs != mine:
                edges[mine].add(theirs)
    level: dict[str, int] = {}

    def of(room: str, seen: tuple[str, ...] = ()) -> int:
        if room in level:
            return level[room]
        if room in seen:
            return 0
        below = [of(t, seen + (room,)) for t in edges.get(room, ())]
        level[room] = 1 + max(below) if below else 0
        return level[room]

    for room in edges:
        of(room)
    return level


def floors(mods: dict[str, Module]) -> dict[str, int]:
    level: dict[str, int] = {}

    def of(name: str, seen: tuple[str, ...] = ()) -> int:
        if name in level:
            return level[name]
        if name in seen:    # a cycle at import time: Python could not import it; count it flat
            return 0
        below = [of(t, seen + (name,)) for t in mods[name].top_imports]
        level[name] = 1 + max(below) if below else 0
        return level[name]

    for name in mods:
        of(name)
    return level


def circles(mods: dict[str, Module]) -> list[list[str]]:
    """Tarjan's strongly connected components of the whole import graph, those of 2+ modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(mods[v].all_imports):
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
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


class Walk:
    def __init__(self, mods: dict[str, Module]):
        self.mods = mods
        self.floor = floors(mods)
        self.stops = self.climbs = self.returns = self.crossings = self.room_crossings = 0
        self.trail: list[str] = []
        self.methods: dict[str, list[tuple[str, str]]] = {}
        for m in mods.values():
            for q in m.functions:
                if "." in q:
                    self.methods.setdefault(q.split(".", 1)[1], []).append((m.name, q))

    def _resolve(self, mod: Module, func: ast.expr, local: dict[str, ast.FunctionDef],
                 receiver_followed: bool) -> tuple[str, str, ast.FunctionDef] | None:
        """(module, qualname, def) of the package function a call names, or None."""
        if isinstance(func, ast.Name):
            if func.id in local:
                return mod.name, func.id, local[func.id]
            return self._named(mod, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            alias = mod.aliases.get(func.value.id)
            if alias and alias[1] is None:
                return self._named(self.mods[alias[0]], func.attr)
            if func.value.id in mod.classes or (alias and alias[1]):
                return None
        if isinstance(func, ast.Attribute) and receiver_followed:
            found = self.methods.get(func.attr, [])
            if len(found) == 1:
                m, q = found[0]
                return m, q, self.mods[m].functions[q]
        return None

    def _named(self, mod: Module, name: str, depth: int = 0):
        if name in mod.functions:
            return mod.name, name, mod.functions[name]
        if name in mod.classes:
            init = mod.functions.get(f"{name}.__init__")
            return (mod.name, f"{name}.__init__", init) if init else None
        alias = mod.aliases.get(name)
        if alias and alias[1] and depth < 8:
            return self._named(self.mods[alias[0]], alias[1], depth + 1)
        return None

    def enter(self, mod: Module, fn: ast.FunctionDef, followed: set[str], stack: tuple[str, ...],
              local: dict[str, ast.FunctionDef] | None = None) -> bool:
        """Walk one function; whether it hands a value back."""
        local = dict(local or {})
        state = {"followed": set(followed)}
        key = f"{mod.name}.{fn.name}"

        def uses(e: ast.AST | None) -> bool:
            if e is None:
                return False
            if isinstance(e, ast.Name):
                return e.id in state["followed"]
            if isinstance(e, ast.Call):
                return call(e)
            if isinstance(e, (ast.Lambda, ast.FunctionDef)):
                return False
            return any([uses(c) for c in ast.iter_child_nodes(e)])

        def call(c: ast.Call) -> bool:
            recv = uses(c.func.value) if isinstance(c.func, ast.Attribute) else False
            args = [uses(a.value if isinstance(a, ast.Starred) else a) for a in c.args]
            kws = {k.arg: uses(k.value) for k in c.keywords}
            if not (recv or any(args) or any(kws.values())):
                return False
            target = self._resolve(mod, c.func, local, recv)
            if target is None:
                return True   # outside the package: the result carries what went in
            tmod, q, tdef = target
            tkey = f"{tmod}.{q}"
            if tkey in stack or tkey == key:
                return True
            params = [a.arg for a in tdef.args.posonlyargs + tdef.args.args]
            skip = 1 if "." in q and params[:1] in (["self"], ["cls"]) else 0
            if skip and isinstance(c.func, ast.Attribute) and recv:
                followed_params = {params[0]}
            else:
                followed_params = set()
            names = params[skip:]
            for i, f in enumerate(args):
                if f and i < len(names):
                    followed_params.add(names[i])
                elif f and tdef.args.vararg:
                    followed_params.add(tdef.args.vararg.arg)
            kwonly = {a.arg for a in tdef.args.kwonlyargs}
            for k, f in kws.items():
                if f and k is not None and (k in names or k in kwonly):
                    followed_params.add(k)
                elif f and tdef.args.kwarg:
                    followed_params.add(tdef.args.kwarg.arg)
            self.stops += 1
            if self.floor[tmod] > self.floor[mod.name]:
                self.climbs += 1
            if tmod != mod.name:
                self.crossings += 1
                if room_of(tmod) != room_of(mod.name):
                    self.room_crossings += 1
            self.trail.append(f"{'  ' * len(stack)}{tkey}")
            inner = local if tmod == mod.name and q in local else None
            gives = self.enter(self.mods[tmod], tdef, followed_params | (state["followed"] if inner else set()),
                               stack + (key,), inner)
            if gives:
                self.returns += 1
            return gives

        def bind(target: ast.expr) -> None:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    state["followed"].add(n.id)

        def stmts(body: list[ast.stmt]) -> None:
            for s in body:
                stmt(s)

        def stmt(s: ast.stmt) -> None:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local[s.name] = s
            elif isinstance(s, ast.Assign):
                if uses(s.value):
                    for t in s.targets:
                        bind(t)
            elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
                if s.value is not None and uses(s.value):
                    bind(s.target)
            elif isinstance(s, (ast.For, ast.AsyncFor)):
                if uses(s.iter):
                    bind(s.target)
                stmts(s.body)
                stmts(s.orelse)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                for item in s.items:
                    if uses(item.context_expr) and item.optional_vars is not None:
                        bind(item.optional_vars)
                stmts(s.body)
            elif isinstance(s, (ast.If, ast.While)):
                uses(s.test)
                stmts(s.body)
                stmts(s.orelse)
            elif isinstance(s, ast.Try):
                stmts(s.body)
                for h in s.handlers:
                    stmts(h.body)
                stmts(s.orelse)
                stmts(s.finalbody)
            elif isinstance(s, ast.ClassDef):
                pass
            else:
                for child in ast.iter_child_nodes(s):
                    uses(child)

        if key.endswith("stage_main") or not stack:
            # the entry: follow what parse_args returns
            for n in ast.walk(fn):
                if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                        and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "parse_args"):
                    bind(n.targets[0])
        stmts(fn.body)
        return any(isinstance(n, ast.Return) and n.value is not None
                   and not (isinstance(n.value, ast.Constant) and n.value.value is None)
                   for n in _own_nodes(fn))


def _own_nodes(fn: ast.FunctionDef):
    """The nodes of a function, not those of the functions defined inside it."""
    todo = list(fn.body)
    while todo:
        n = todo.pop()
        yield n
        todo += [c for c in ast.iter_child_nodes(n) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                            ast.Lambda, ast.ClassDef))]


def figures(pkg: Path, entry: str) -> dict:
    mods = load(pkg)
    level = floors(mods)
    sizes = {m.path.relative_to(pkg).as_posix(): len(m.path.read_text().splitlines()) for m in mods.values()}
    largest = max(sizes.items(), key=lambda kv: kv[1])
    rooms = {name.split(".")[0] for name, m in mods.items() if name and (m.is_pkg or "." in name)}
    top = [name for name, m in mods.items() if name and not m.is_pkg and "." not in name]
    mod_name, func = entry.rsplit(".", 1)
    walk = Walk(mods)
    walk.enter(mods[mod_name], mods[mod_name].functions[func], set(), ())
    return {"modules": len([m for m in mods.values() if not m.is_pkg]), "rooms": len(rooms) + (1 if top else 0),
            "room_floors": max(room_floors(mods).values()) + 1, "module_floors": max(level.values()) + 1,
            "circles": circles(mods),
            "largest": {"module": largest[0], "lines": largest[1]},
            "stops": walk.stops, "climbs": walk.climbs, "returns": walk.returns, "crossings": walk.crossings,
            "room_crossings": walk.room_crossings, "trail": walk.trail}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", type=Path, help="the package's folder")
    p.add_argument("--entry", default="cli.stage_main", help="MODULE.FUNCTION the walk starts from")
    p.add_argument("--trail", action="store_true", help="also print each stop, indented by depth")
    a = p.parse_args(argv)
    got = figures(a.package, a.entry)
    trail = got.pop("trail")
    print(json.dumps(got, indent=2))
    if a.trail:
        print("\n".join(trail))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
