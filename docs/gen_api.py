"""Write the API reference pages (docs/reference/api/) from the declared public API: one page
per public module, one entry per name of its ``__all__``, rendered by mkdocstrings from the
object's own module. ``tests/test_docs.py`` fails when the pages and ``__all__`` disagree.

    python docs/gen_api.py
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

#: the supported API: these modules' ``__all__`` (tests/test_public_api.py runs their examples)
PUBLIC_MODULES = ("hwnas", "hwnas.supernet", "hwnas.latency", "hwnas.quant", "hwnas.search",
                  "hwnas.export")
OUT = Path(__file__).resolve().parent / "reference" / "api"


def pages() -> dict[str, str]:
    """File name -> Markdown of every API page."""
    out = {}
    index = ["# Python API", "",
             "The supported API is what these modules list in `__all__`; every name has an "
             "example, run as a test. Other names importable from hwnas are internal.", ""]
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        summary = (inspect.getdoc(module) or "").split("\n\n")[0].replace("\n", " ")
        page = f"{module_name}.md"
        index.append(f"- [`{module_name}`]({page}): {summary}")
        lines = [f"# `{module_name}`", "", inspect.getdoc(module) or "", ""]
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                lines += [f"## `{module_name}.{name}`", "", f"`{name} = {obj!r}`", ""]
                continue
            target = f"{obj.__module__}.{obj.__qualname__}"
            lines += [f"## `{module_name}.{name}`", "", f"::: {target}", "    options:",
                      "      show_root_heading: false", "      show_root_toc_entry: false", ""]
        out[page] = "\n".join(lines).rstrip() + "\n"
    out["index.md"] = "\n".join(index) + "\n"
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (OUT / name).write_text(text)
    print(f"wrote {len(pages())} pages to {OUT}")


if __name__ == "__main__":
    main()
