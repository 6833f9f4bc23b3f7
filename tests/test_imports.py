"""The package's imports, read from the code (at module level and inside functions alike: an
import put inside a function only to dodge a circle still ties the two modules together):

- no import circle between modules;
- every import runs down the layers of `LAYERS`, the order docs/architecture.md draws ("The
  layers"): a module imports its own package (or top-level module) freely, any package of a
  lower row, and nothing of its own row or above.
"""

import ast
import re
from pathlib import Path

import anydraft

ROOT = Path(anydraft.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"

# The layers, bottom first: each row the packages (anydraft/NAME/) and top-level modules
# (anydraft/NAME.py) on it; "anydraft" is the package's face, anydraft/__init__.py. A row's
# members never import each other: two that must, stand on two rows.
LAYERS = (
    ("errors", "atomic"),  # what every layer may use: a user's error; where files go, written whole
    ("bridge",),  # two tokenizers: pure tables and functions, no model
    ("planning",),  # every decision about a step: pure rules over estimates, and every setting
    ("hardware",),  # the machine, and the cost curves measured on it from the sessions handed in
    ("models",),  # sessions over every backend; loading, and what "auto" loads (measured)
    ("config",),  # DraftConfig
    ("sampling",),  # SamplingParams and the one logits transform
    ("constraints",),  # a grammar's mask on the target's distribution
    ("methods",),  # proposers and verifiers
    ("decoding",),  # the loop and one step's mechanics
    ("request", "options", "chat", "prompts", "learned", "scouted"),  # what a request asks; what was learned
    ("decoder",),  # the pair, and each request's Generation
    ("anydraft",),  # the public face: Decoder, DraftConfig, SamplingParams
    ("hf", "demo", "bench", "server"),  # programs over the decoder
    ("scout", "doctor"),  # commands over the bench
    ("cli",),
    ("__main__", "deploy"),
)
ROW = {unit: row for row, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The package or top-level module ``module`` belongs to: its row in `LAYERS`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imported(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for each of the package's modules that ``path`` imports, relative
    imports resolved: ``from a import b`` names a.b where that is a module, else a (a
    package's ``__init__``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full if full in modules else base))
    return sorted((line, m) for line, m in out if m in modules and m != name)


def paths() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def graph() -> dict[str, set[str]]:
    modules = {module_name(p) for p in paths()}
    return {module_name(p): {m for _, m in imported(p, modules)} for p in paths()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def against_the_layers(module: str, line: int, target: str, where: str) -> str | None:
    """Why ``module``'s import of ``target`` (at ``where``:``line``) breaks `LAYERS`, or None."""
    a, b = unit(module), unit(target)
    if a == b or ROW[b] < ROW[a]:
        return None
    how = "on its own row" if ROW[b] == ROW[a] else "on a row above it"
    return (f"{where}:{line}: {module} imports {target}: {a} (row {ROW[a]}) imports {b} "
            f"(row {ROW[b]}), {how}")


def upward() -> list[str]:
    modules = {module_name(p) for p in paths()}
    found = []
    for path in paths():
        module = module_name(path)
        for line, target in imported(path, modules):
            why = against_the_layers(module, line, target, str(path.relative_to(ROOT.parent)))
            if why:
                found.append(why)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_reads_relative_and_in_function_imports():
    edges = graph()
    assert "anydraft.planning.cost" in edges["anydraft.planning.policy"]  # from .cost import ...
    assert "anydraft.decoding.step" in edges["anydraft.decoding.loop"]
    assert "anydraft.decoder" in edges["anydraft"]  # from . import decoder, inside __getattr__
    assert "anydraft.scouted" in edges["anydraft.decoder"]  # inside Decoder.__init__


def test_every_package_and_top_level_module_has_one_row():
    units = {unit(module_name(p)) for p in paths()}
    assert units - set(ROW) == set(), "not placed in LAYERS (and docs/architecture.md)"
    assert set(ROW) - units == set(), "in LAYERS, but no such package or module"
    assert len(ROW) == sum(len(row) for row in LAYERS), "placed twice"


def test_the_layer_check_names_the_import_and_the_two_rows():
    assert against_the_layers("anydraft.models.backends", 14, "anydraft.models.auto", "x") is None
    assert against_the_layers("anydraft.models.auto", 14, "anydraft.hardware.profile", "x") is None
    up = against_the_layers("anydraft.hardware.profile", 7, "anydraft.models.loading",
                            "anydraft/hardware/profile.py")
    assert up.startswith("anydraft/hardware/profile.py:7: ") and "hardware (row 3) imports models (row 4)" in up
    beside = against_the_layers("anydraft.request", 3, "anydraft.options", "anydraft/request.py")
    assert beside.endswith("on its own row")


def test_every_import_runs_down_the_layers():
    found = upward()
    assert not found, "imports against the layers (tests/test_imports.py LAYERS):\n" + "\n".join(found)


def test_docs_draw_the_layers_in_this_order():
    """docs/architecture.md's picture of the layers names each package or module (``name/``,
    ``name.py``; the face as ``anydraft/``) first on its own row, top row first."""
    text = DOC.read_text()
    block = text[text.index("## The layers"):].split("```")[1]
    named = []
    for token in re.findall(r"(?<![\w/.])(\w+)(?:/|\.py\b)", block):
        if token in ROW and token not in named:
            named.append(token)
    assert set(named) == set(ROW), f"docs/architecture.md leaves out {sorted(set(ROW) - set(named))}"
    rows = [ROW[u] for u in named]
    assert rows == sorted(rows, reverse=True), (
        f"docs/architecture.md draws, top first, {named}; LAYERS: {list(reversed(LAYERS))}")
