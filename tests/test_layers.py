"""The import graph points one way: ``cli -> compose -> configs -> learners -> eval -> episodes -> judges ->
(policies, envs) -> core``. A module may import its own wing and any wing below it, never one above or beside it (envs
and policies never import each other), so a learner receives its world instead of building it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lrmgym"
RANK = {
    "core": 0, "registry": 0, "cache": 0, "files": 0,
    "progress": 0,  # log-friendly progress lines for every wing's loops (stdlib only)
    "envs": 1, "policies": 1,
    "judges": 2,
    "testing": 2.5,  # the public test kit: mocks and batteries over envs, policies and judges
    "episodes": 2.7,  # multi-turn episodes of a policy in an env: below eval and learners
    "eval": 3,
    "tracking": 3.5,  # experiment trackers (TensorBoard, W&B, MLflow): fed by the learners' loop, below it
    "report": 3.8,  # `lrmgym report`: reads run directories (imports only files); the loop draws its plots with it
    "learners": 4,
    "configs": 5,
    "runs": 5.5,  # a trained run read back (policy.path=RUN) and its eval/export commands: over configs, learners
    "compose": 6,
    "integrations": 6.5,  # OpenRLHF's data, plug-ins and launch, `lrmgym serve`: over the composition root
    "adapters": 6.7,  # TRL reward functions, verl compute_score and export: over integrations' labels and scorer
    "cli": 7,
}  # fmt: skip
BESIDE = {frozenset({"envs", "policies"})}


def _wing(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else "__init__"


def _imports(path: Path) -> list[tuple[str, int]]:
    """``(wing imported, line)`` for every import of an ``lrmgym`` module in ``path`` (lazy ones included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "lrmgym":
                names = [a.name for a in node.names]
            elif node.module.startswith("lrmgym."):
                names = [node.module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [
                a.name.split(".")[1] if "." in a.name else "lrmgym" for a in node.names if a.name.startswith("lrmgym")
            ]
        out += [(n, node.lineno) for n in names]
    return out


def _arrows() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _wing(path)
        for tgt, line in _imports(path):
            found.append((src, tgt, f"{path.relative_to(PACKAGE.parent)}:{line}"))
    return found


def test_every_wing_is_ranked():
    wings = {_wing(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__", "_version"}
    assert wings <= set(RANK), f"give these a rank in tests/test_layers.py: {sorted(wings - set(RANK))}"


@pytest.mark.parametrize(("src", "tgt", "where"), _arrows(), ids=lambda x: str(x))
def test_no_import_runs_up_or_sideways(src, tgt, where):
    if src == "__init__" or src == tgt:
        return  # the package facade, a wing's own modules
    if tgt == "lrmgym":  # the facade reaches every wing: only the top (cli) may use it
        assert RANK.get(src, 0) >= RANK["compose"], f"{where}: `import lrmgym` inside {src}; import the module needed"
        return
    if tgt not in RANK:
        return  # version metadata and the like
    if RANK[src] == RANK[tgt] == 0:
        return  # core, registry and cache form the bottom layer together
    assert frozenset({src, tgt}) not in BESIDE, f"{where}: {src} imports {tgt}, a wing beside it"
    assert RANK[tgt] < RANK[src], f"{where}: {src} (rank {RANK[src]}) imports {tgt} (rank {RANK[tgt]}), a wing above it"
