"""The layer order docs/extending.md states, and the torch-free settings it promises.

Both read the source, not the running program: the imports are found by walking each
file's syntax tree (every import that runs, at module level or inside a function; the
ones under ``if TYPE_CHECKING:`` only name types), and the order by parsing the fenced
``layers`` block of the docs, so the test and the docs cannot drift apart.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.run_helpers import REPO

DOCS = REPO / "docs" / "extending.md"
#: Folders whose code is not product code: tests, docs, configs and run outputs.
NOT_PRODUCT = {"tests", "docs", "conf", "outputs"}


def layers() -> list[set[str]]:
    """The docs' layers, top first: each a set of folder (or top-level module) names."""
    block = re.search(r"```layers\n(.*?)```", DOCS.read_text(), re.S)
    assert block, f"{DOCS} has no ```layers block"
    rows = [re.split(r"\s{2,}", line.strip())[0].split() for line in block.group(1).splitlines() if line.strip()]
    return [{name.removesuffix(".py").rstrip("/") for name in row} for row in rows]


def product_files() -> dict[Path, str]:
    """Every product Python file and the top-level name (folder or module) it belongs to."""
    files = {}
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if parts[0] in NOT_PRODUCT or parts[0].startswith("."):
            continue
        files[path] = parts[0] if len(parts) > 1 else path.stem
    return files


class RuntimeImports(ast.NodeVisitor):
    """The absolute module names a file imports when it runs (type-checking blocks skipped)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(node.lineno, alias.name) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.found.append((node.lineno, node.module))


def runtime_imports(path: Path) -> list[tuple[int, str]]:
    visitor = RuntimeImports()
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def upward_imports(files: dict[Path, str], order: list[set[str]]) -> list[str]:
    """Each import of a product name that is not in a layer strictly below the importer's."""
    rank = {name: index for index, row in enumerate(order) for name in row}
    wrong = []
    for path, own in files.items():
        for line, module in runtime_imports(path):
            target = module.split(".")[0]
            if target == own or target not in set(files.values()):
                continue  # its own folder, or a library
            if rank[target] <= rank[own]:
                wrong.append(f"{shown(path)}:{line} imports {module} ({own} is not above {target})")
    return wrong


def test_every_product_folder_has_a_layer():
    named = set().union(*layers())
    missing = set(product_files().values()) - named
    assert not missing, f"add {sorted(missing)} to the layers block of {DOCS.relative_to(REPO)}"


def test_imports_run_down_the_layers():
    wrong = upward_imports(product_files(), layers())
    assert not wrong, "imports that run up (or sideways) a layer:\n" + "\n".join(wrong)


def test_the_check_finds_an_upward_import(tmp_path):
    """The check itself: a settings module that imported the model would be caught."""
    bent = tmp_path / "settings" / "bent.py"
    bent.parent.mkdir()
    bent.write_text("def f():\n    from lightning_modules.llama import Llama\n")
    typed = tmp_path / "settings" / "typed_only.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from launch.run_settings import RunSettings\n"
    )
    files = {**product_files(), bent: "settings", typed: "settings"}
    assert upward_imports(files, layers()) == [
        f"{bent}:2 imports lightning_modules.llama (settings is not above lightning_modules)"
    ]


def section_modules() -> list[str]:
    """The modules that define a settings section: subclasses of ``Section``, followed through
    the class names they derive from until no new one appears."""
    trees = {path: ast.parse(path.read_text()) for path in product_files()}
    names, modules = {"Section"}, set()
    while True:
        before = (len(names), len(modules))
        for path, tree in trees.items():
            for node in ast.walk(tree):
                bases = {getattr(base, "id", getattr(base, "attr", None)) for base in getattr(node, "bases", [])}
                if isinstance(node, ast.ClassDef) and bases & names:
                    names.add(node.name)
                    modules.add(".".join(path.relative_to(REPO).with_suffix("").parts))
        if (len(names), len(modules)) == before:
            return sorted(modules)


#: Config choices read besides the experiments: every technique, and the other strategies and optimizers.
READ_ALSO = [["+technique=" + path.stem] for path in sorted((REPO / "conf" / "technique").glob("*.yaml"))] + [
    ["strategy=fsdp2"],
    ["strategy=ddp"],
    ["optimizer=muon"],
    ["layout.float8=tensorwise"],
]

PROBE = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
modules = json.loads(sys.argv[1])
for name in modules + ["launch.from_config", "launch.run_settings", "callbacks.technique"]:
    __import__(name)
from launch.from_config import read_settings
HEAVY = ("torch", "lightning", "lightning.pytorch")
loaded = {"importing": [m for m in HEAVY if m in sys.modules]} if any(m in sys.modules for m in HEAVY) else {}
with initialize_config_dir(config_dir=sys.argv[2], version_base="1.3"):
    for overrides in json.loads(sys.argv[3]):
        read_settings(compose("train", overrides=overrides))
        heavy = [m for m in HEAVY if m in sys.modules]
        if heavy:
            loaded[" ".join(overrides)] = heavy
print(json.dumps(loaded))
"""


def test_settings_and_their_assembly_load_no_torch():
    """Every section module, the assembly, and reading every experiment's settings (and each
    technique's, strategy's and optimizer's) leave torch and Lightning unloaded, in a fresh
    interpreter: that is what keeps a config error within about a second of CPU."""
    modules = section_modules()
    assert {"lightning_modules.llama_settings", "callbacks.diloco.settings", "settings.strategy"} <= set(modules)
    reads = [["+experiment=" + path.stem] for path in sorted((REPO / "conf" / "experiment").glob("*.yaml"))]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(modules), str(REPO / "conf"), json.dumps(reads + READ_ALSO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}, "these reads loaded torch or Lightning"
