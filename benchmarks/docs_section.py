"""Write a benchmark's generated tables into docs/benchmarks.md between markers.

The text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` is replaced on every full run;
everything outside the markers (the discussion) is written by hand and left alone.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def replace_section(name: str, body: str, title: str, path: Path = DOCS) -> Path:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def replace_titled_section(title: str, text: str, path: Path = DOCS) -> Path:
    """Replace the whole section whose heading starts with ``## title`` by ``text`` (which starts
    with its own heading), up to the next ``## `` heading; append it if there is none yet. For
    benchmarks that write their section whole, tables and hand-written prose file together."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    start = old.find(f"## {title}")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text.strip("\n") + "\n"
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text.strip("\n") + "\n" + ("" if end < 0 else old[end:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    return path
