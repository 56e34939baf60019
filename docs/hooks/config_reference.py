"""MkDocs hook: the configuration reference, generated at build time from the fields of
`bridge.config.BridgeConfig` (their types, defaults, bounds and descriptions), so the page
lists every setting exactly as `stb config check` validates it and never drifts from the
code. `mkdocs.yml` names this file under `hooks`; a page asks for the reference with the
line `<!-- stb:config-reference -->` (docs/operators/configuration.md)."""

from __future__ import annotations

import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from bridge.config import BridgeConfig

MARKER = "<!-- stb:config-reference -->"

_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "<="),
)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' page event: put the reference where the marker line is."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())


def reference() -> str:
    """Markdown: the top-level settings, then one table per TOML section."""
    out = ["### Top level", "", *_table(BridgeConfig, toml_prefix="", env_prefix="STB_")]
    for name, field in BridgeConfig.model_fields.items():
        section = _model_of(field.annotation)
        if section is not None:
            heading, env = f"[{name}]", f"STB_{name.upper()}__"
        else:
            section = _dict_model_of(field.annotation)
            if section is None:
                continue
            heading, env = f"[{name}.NAME]", ""  # a table per name: no single variable
        out += ["", f"### `{heading}`", ""]
        if field.description:
            out += [_cell(field.description), ""]
        elif section.__doc__:
            out += [_cell(section.__doc__), ""]
        out += _table(section, toml_prefix=heading, env_prefix=env)
        for sub_name, sub in section.model_fields.items():  # a table inside the section
            sub_model = _model_of(sub.annotation)
            if sub_model is None or not env:
                continue
            out += ["", f"### `[{name}.{sub_name}]`", ""]
            out += [_cell(sub.description or sub_model.__doc__ or ""), ""]
            out += _table(sub_model, f"[{name}.{sub_name}]", f"{env}{sub_name.upper()}__")
    return "\n".join(out) + "\n"


def _table(model: type[BaseModel], toml_prefix: str, env_prefix: str) -> list[str]:
    rows = ["| setting | type | default | what it is |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if model is BridgeConfig and (
            _model_of(field.annotation) or _dict_model_of(field.annotation)
        ):
            continue  # a section of its own
        setting = f"`{name}`"
        if _model_of(field.annotation):  # a table inside the section: its own table below
            where = f"{toml_prefix[:-1]}.{name}]"
            rows.append(f"| {setting} | table | | {_cell(field.description or '')} (`{where}`) |")
            continue
        if env_prefix:
            setting += f"<br>`{env_prefix}{name.upper()}`"
        rows.append(
            f"| {setting} | {_type_name(field.annotation)}{_bounds(field)} "
            f"| {_default(field)} | {_cell(field.description or '')} |"
        )
    return rows


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _dict_model_of(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is dict:
        return _model_of(typing.get_args(annotation)[1])
    return None


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        optional = ", optional" if type(None) in args else ""
        return " \\| ".join(names) + optional
    if origin in (tuple, list):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[0])} to {_type_name(args[1])}"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type):
        return {"str": "string", "float": "number", "int": "integer", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return _cell(str(annotation))


def _bounds(field: FieldInfo) -> str:
    found = [
        f"{sign} {getattr(item, attr)}"
        for item in field.metadata
        for kind, attr, sign in _BOUNDS
        if isinstance(item, kind)
    ]
    return f" ({', '.join(found)})" if found else ""


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), BaseModel):
        return ", ".join(f"`{k}`" for k in value)
    if isinstance(value, (tuple, list)):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    """One table cell: a single line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")
