"""The README's shell commands as tests read them: each ```bash block under its `## ` heading, a
line ending in a backslash joined to the next as bash joins it (inside quotes too)."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = ROOT / "README.md"


def sections() -> dict[str, str]:
    """{`## ` heading without the hashes: its text up to the next `## ` heading}."""
    parts = re.split(r"(?m)^## ", README.read_text())[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


def commands(text: str) -> list[str]:
    """The commands of every ```bash block in `text`, continuation lines joined."""
    found: list[str] = []
    for block in re.findall(r"(?ms)^```bash\n(.*?)^```", text):
        joined = block.replace("\\\n", "")
        found += [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]
    return found


def section_commands(heading: str) -> list[str]:
    """The commands under the `## ` heading that starts with `heading`."""
    [text] = [t for h, t in sections().items() if h.startswith(heading)]
    return commands(text)
