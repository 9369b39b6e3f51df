"""Reading a YAML file into a validated pydantic model, with one-line errors that name the field.

Run directories (``run.yaml``) and fault scenarios share this; each passes its own error class
and a hint saying what the file should hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from .errors import RemedyError

__all__ = ["load_yaml_model", "first_error"]

M = TypeVar("M", bound=BaseModel)


def first_error(ex: PydanticValidationError) -> str:
    """The first validation problem as ``field 'a.b': message (and N more)``."""
    err = ex.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {ex.error_count() - 1} more)" if ex.error_count() > 1 else ""
    return f"field '{where}': {err['msg']}{more}"


def load_yaml_model(path: Path, model: type[M], error: type[RemedyError], mapping_hint: str) -> M:
    """Parse ``path`` as YAML and validate it as ``model``; every failure is one ``error`` line."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as ex:
        raise error(f"cannot read {path}: {ex.strerror}; check the path") from ex
    except yaml.YAMLError as ex:
        raise error(f"{path} is not valid YAML: {str(ex).splitlines()[0]}; fix the file") from ex
    if not isinstance(data, dict):
        raise error(f"{path} must be a mapping {mapping_hint}")
    try:
        return model.model_validate(data)
    except PydanticValidationError as ex:
        raise error(f"{path}: {first_error(ex)}") from None
