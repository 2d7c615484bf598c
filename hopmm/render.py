"""Snippets -> one self-contained kernel source.

The `.cuh` snippets are inlined (each once, in include order) so the rendered source is the
whole truth: NVRTC needs no include path, `HOPMM_DUMP_SOURCE` shows everything, and the
source's hash, which keys the cubin cache, changes whenever any snippet changes. The header
also lists each snippet's own hash.
"""
from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^\s*#pragma once\s*$", re.MULTILINE)


def snippet_dir() -> Path:
    """csrc/hopmm in a checkout (editable install), hopmm/csrc/hopmm in an installed package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc" / "hopmm", here / "csrc" / "hopmm"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("hopmm's CUDA snippets (csrc/hopmm/*.cuh) are missing from the install")


def read_snippet(name: str) -> str:
    return (snippet_dir() / name).read_text()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def inline_snippets(names: list[str]) -> tuple[str, dict[str, str]]:
    """Returns the concatenated snippets with includes resolved, and {snippet: sha256}."""
    seen: dict[str, str] = {}
    parts: list[str] = []

    def visit(name: str) -> None:
        if name in seen:
            return
        text = read_snippet(name)
        seen[name] = sha256(text)
        for dep in _INCLUDE.findall(text):
            visit(dep)
        body = _PRAGMA_ONCE.sub("", _INCLUDE.sub("", text)).strip()
        parts.append(f"// ---- {name} ----\n{body}\n")

    for name in names:
        visit(name)
    return "\n".join(parts), seen


@dataclass(frozen=True)
class RenderedKernel:
    name: str
    source: str
    snippet_hashes: dict

    @property
    def source_hash(self) -> str:
        return sha256(self.source)


def render_kernel(name: str, snippets: list[str], fields: dict, slots: dict,
                  entry: str = "kernel_entry.cu.in") -> RenderedKernel:
    """Fills the entry template `entry` (kernel_entry.cu.in: the TMA kernels' signature):
    `fields` become `static constexpr` members of Config, `slots` name the skeleton and the
    producer / consumer / epilogue types, and may give KERNEL_ATTRIBUTES (e.g.
    `__cluster_dims__(2, 1, 1) `; none by default)."""
    slots = {"KERNEL_ATTRIBUTES": "", **slots}
    body, hashes = inline_snippets(snippets)
    provenance = " ".join(f"{n}@{h[:16]}" for n, h in sorted(hashes.items()))
    config_fields = "\n".join(f"    static constexpr {_ctype(v)} {k} = {_cvalue(v)};"
                              for k, v in fields.items())
    source = string.Template(read_snippet(entry)).substitute(
        PROVENANCE=f"snippets: {provenance}", SNIPPETS=body, CONFIG_FIELDS=config_fields,
        KERNEL_NAME=name, **slots)
    return RenderedKernel(name=name, source=source, snippet_hashes=hashes)


def _ctype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "unsigned" if value >= 2**31 else "int"
    raise TypeError(f"unsupported Config field type: {type(value).__name__}")


def _cvalue(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
