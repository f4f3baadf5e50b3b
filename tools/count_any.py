"""Count `typing.Any` in the package's code (imports excluded), per top-level folder.

`python tools/count_any.py` prints the table; tools/test.sh prints it with the type check. An `Any`
is an opt-out of the type checker, so the count is the part of the code it cannot see.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "slurmtrain"


def any_count(path: Path) -> int:
    """`Any` names and `typing.Any` attributes outside import statements."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id == "Any":
            count += 1
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            count += 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # string annotations ("dict[str, Any]") are parsed too
            try:
                inner = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            count += sum(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(inner))
    return count


def main() -> int:
    per_folder: Counter[str] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        folder = relative.parts[0] if len(relative.parts) > 1 else "."
        per_folder[folder] += any_count(path)
    for folder, count in sorted(per_folder.items()):
        print(f"{folder:10s} {count:5d}")
    print(
        f"{'total':10s} {sum(per_folder.values()):5d}  (typing.Any in slurmtrain/, imports excluded)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
