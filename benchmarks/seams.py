"""Structure of the source as issue 46 measures it: file circles (package faces included),
arrows against the layering, the largest modules, functions over 80 lines and module
docstrings over 15 lines. Reads the graph with ``tests/test_import_direction.py``'s functions, so
it counts what that test enforces. ``python benchmarks/seams.py [--out seams.json]``"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_import_direction as graph  # noqa: E402


def measure() -> dict:
    mods = graph._modules()
    sizes, long_functions, long_docs = [], [], []
    for path in mods.values():
        text = path.read_text()
        tree = ast.parse(text)
        rel = str(path.relative_to(ROOT))
        sizes.append((len(text.splitlines()), rel))
        if len((ast.get_docstring(tree) or "").splitlines()) > 15:
            long_docs.append(rel)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long_functions.append({"function": f"{rel}:{node.name}", "lines": lines})
    return {
        "modules": len(mods),
        "circles": [sorted(c) for c in graph.circles()],
        "back_arrows": sorted(f"{a} -> {b}" for a, b in graph.violations()),
        "largest_modules": [{"module": m, "lines": n} for n, m in sorted(sizes, reverse=True)[:6]],
        "functions_over_80_lines": sorted(long_functions, key=lambda r: -r["lines"]),
        "module_docstrings_over_15_lines": sorted(long_docs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).with_suffix(".json")))
    args = p.parse_args()
    m = measure()
    print(f"modules {m['modules']}; circles {len(m['circles'])}; back-arrows "
          f"{len(m['back_arrows'])}; functions > 80 lines {len(m['functions_over_80_lines'])}; "
          f"module docstrings > 15 lines {len(m['module_docstrings_over_15_lines'])}")
    for c in m["circles"]:
        print("  circle:", " <-> ".join(c))
    for r in m["largest_modules"]:
        print(f"  {r['lines']:5d}  {r['module']}")
    for r in m["functions_over_80_lines"]:
        print(f"  {r['lines']:5d}  {r['function']}")
    out = {"command": " ".join(["python", *sys.argv]), "machine": platform.platform(),
           "date": time.strftime("%Y-%m-%d"), **m}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
