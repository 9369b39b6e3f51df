"""Reading YAML safely, and a YAML file into a validated pydantic model with one-line errors.

Run directories (``run.yaml``), fault scenarios and patch files share this; each passes its own
error class and a hint saying what the file should hold. YAML from outside is bounded: the
file's size, the number of aliases (``*ref``) and the size of the data once every alias is
expanded -- a "billion laughs" document is a few hundred bytes that expands to gigabytes the
moment anything walks it (pydantic validation does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from .errors import RemedyError

__all__ = [
    "BoundedLoader",
    "load_yaml_model",
    "safe_load_yaml",
    "check_expanded_size",
    "first_error",
    "MAX_YAML_BYTES",
    "MAX_YAML_ALIASES",
    "MAX_EXPANDED_NODES",
]

M = TypeVar("M", bound=BaseModel)

#: YAML files above this size are refused unread (run.yaml, scenarios and patches are a few KB).
MAX_YAML_BYTES = 1_000_000
#: aliases allowed in one document; hand-written configs use a handful, bombs use thousands
MAX_YAML_ALIASES = 100
#: values (scalars, lists, mappings) a document may hold with every alias expanded
MAX_EXPANDED_NODES = 100_000


class _LimitExceeded(yaml.YAMLError):
    """Raised inside the loader; turned into the caller's RemedyError with the source named."""


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases while composing and stops past :data:`MAX_YAML_ALIASES`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise _LimitExceeded(f"more than {MAX_YAML_ALIASES} YAML aliases (*refs)")
        return super().compose_node(parent, index)


def safe_load_yaml(text: str, source: str, error: type[RemedyError]) -> Any:
    """Parse YAML ``text`` with the safe loader and the limits above; any failure is one ``error``."""
    if len(text) > MAX_YAML_BYTES:
        raise error(f"{source} is {len(text):,} characters; a YAML file here must be under {MAX_YAML_BYTES:,}")
    loader = BoundedLoader(text)
    try:
        data = loader.get_single_data()
    except _LimitExceeded as ex:
        raise error(f"{source}: {ex}; write the values out instead of referencing them") from None
    except yaml.YAMLError as ex:
        mark = getattr(ex, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(ex, "problem", None) or str(ex).splitlines()[0]
        raise error(f"{source} is not valid YAML ({problem}{where}); fix the file") from None
    except RecursionError:
        raise error(f"{source}: YAML nested too deeply; flatten the file") from None
    finally:
        loader.dispose()
    check_expanded_size(data, source, error)
    return data


def check_expanded_size(data: Any, what: str, error: type[RemedyError], bound: int = MAX_EXPANDED_NODES) -> None:
    """Refuse ``data`` if it holds more than ``bound`` values once shared references are expanded.

    Walks iteratively and stops at the bound, so checking a bomb costs ``bound`` steps, not its size.
    """
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > bound:
            raise error(f"{what}: more than {bound:,} values once aliases are expanded; refusing it as a YAML bomb")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)


def first_error(ex: PydanticValidationError) -> str:
    """The first validation problem as ``field 'a.b': message (and N more)``."""
    err = ex.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {ex.error_count() - 1} more)" if ex.error_count() > 1 else ""
    return f"field '{where}': {err['msg']}{more}"


def load_yaml_model(path: Path, model: type[M], error: type[RemedyError], mapping_hint: str) -> M:
    """Parse ``path`` as YAML and validate it as ``model``; every failure is one ``error`` line."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise error(f"{path} is {size:,} bytes; a YAML file here must be under {MAX_YAML_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text; save it as UTF-8 YAML") from None
    except OSError as ex:
        raise error(f"cannot read {path}: {ex.strerror or ex}; check the path") from ex
    data = safe_load_yaml(text, str(path), error)
    if not isinstance(data, dict):
        raise error(f"{path} must be a mapping {mapping_hint}")
    try:
        return model.model_validate(data)
    except PydanticValidationError as ex:
        raise error(f"{path}: {first_error(ex)}") from None
