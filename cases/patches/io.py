"""Reading and writing patch files (YAML or JSON, chosen by extension).

A patch file holds either one part (``kind: reward_shaping`` ...) or a whole
patch (``description`` and ``parts: [...]``). Reward code is written as a YAML
literal block so the file reads like the code it carries.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import yaml

from ..errors import PatchError
from ..yamlfile import check_expanded_size, safe_load_yaml
from .spec import Patch

__all__ = ["PATCH_SUFFIXES", "MAX_PATCH_BYTES", "load_patch", "save_patch", "patch_to_yaml", "patch_from_text"]

PATCH_SUFFIXES = (".yaml", ".yml", ".json")
#: patch files above this size are refused unread (reward code is capped far lower by the sandbox).
MAX_PATCH_BYTES = 1_000_000


def load_patch(path: Path) -> Patch:
    """Read a patch from ``path`` (.yaml/.yml/.json); raises :class:`PatchError` with one line saying why not."""
    path = Path(path)
    fmt = _format_of(path)
    try:
        size = path.stat().st_size
        if size > MAX_PATCH_BYTES:
            raise PatchError(f"patch file {path} is {size:,} bytes; a patch must be under {MAX_PATCH_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PatchError(f"patch file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise PatchError(f"{path} is a directory; pass a .yaml or .json patch file") from None
    except (OSError, UnicodeDecodeError) as ex:
        raise PatchError(f"cannot read patch file {path}: {ex}") from None
    return patch_from_text(text, fmt, source=str(path))


def patch_from_text(text: str, fmt: str = "yaml", source: str = "<patch>") -> Patch:
    """Parse patch text in ``fmt`` ("yaml" or "json"); ``source`` names it in error messages."""
    data = _parse(text, fmt, source)
    if data is None:
        raise PatchError(f"{source}: the patch file is empty; write a part (kind: ...) or parts: [...]")
    if not isinstance(data, dict):
        raise PatchError(f"{source}: a patch must be a mapping with 'kind' or 'parts', not a {type(data).__name__}")
    try:
        return Patch.from_data(data)
    except pydantic.ValidationError as ex:
        raise PatchError(f"{source}: {_one_line(ex)}") from None


def save_patch(patch: Patch, path: Path) -> None:
    """Write ``patch`` to ``path`` as YAML or JSON (by extension); parent directories are created."""
    path = Path(path)
    fmt = _format_of(path)
    text = patch_to_yaml(patch) if fmt == "yaml" else json.dumps(_dump(patch), indent=2) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as ex:
        raise PatchError(f"cannot write patch file {path}: {ex}") from None


def patch_to_yaml(patch: Patch) -> str:
    """The patch as YAML, multi-line strings (reward code) as literal ``|`` blocks."""
    return yaml.dump(_dump(patch), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def _dump(patch: Patch) -> dict[str, Any]:
    return patch.model_dump(mode="json")


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in PATCH_SUFFIXES:
        raise PatchError(f"patch file {path} must end in .yaml, .yml or .json (got '{suffix or 'no suffix'}')")
    return "json" if suffix == ".json" else "yaml"


def _parse(text: str, fmt: str, source: str) -> Any:
    # Both paths bound the expanded size: curriculum env_kwargs and hyperparameter changes are
    # handed to env constructors and SB3 as they are.
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as ex:
            raise PatchError(f"{source}: not valid JSON ({ex.msg} at line {ex.lineno} column {ex.colno})") from None
        except RecursionError:
            raise PatchError(f"{source}: JSON nested too deeply; flatten the file") from None
        check_expanded_size(data, source, PatchError)
        return data
    return safe_load_yaml(text, source, PatchError)


def _one_line(ex: pydantic.ValidationError) -> str:
    """Pydantic's problems as one line: ``parts.0.reward_shaping.code: Field required; ...``."""
    bits = []
    for err in ex.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "patch"
        bits.append(f"{loc}: {err.get('msg', 'invalid')}")
    more = f" (+{ex.error_count() - 3} more)" if ex.error_count() > 3 else ""
    return "; ".join(bits) + more


_YAML_BREAKS = ("\r", "\x85", "\u2028", "\u2029")


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # PyYAML falls back to quoting when a literal block cannot hold the text (e.g. trailing spaces);
    # line breaks YAML folds on its own (CR, NEL, LS, PS) only survive double quotes
    style: str | None
    if any(ch in value for ch in _YAML_BREAKS):
        style = '"'
    else:
        style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)
