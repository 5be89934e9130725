"""Reading a config file and turning pydantic's errors into issues an SRE can act on: file, key, problem, fix."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from guardian.config.base import masked_url
from guardian.config.model import Config


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    message: str
    fix: str


class ConfigError(Exception):
    """The config was refused; ``str()`` is the full report."""

    def __init__(self, path: str, issues: list[ConfigIssue]) -> None:
        self.path = path
        self.issues = issues
        lines = [f"{path}: {len(issues)} problem{'s' if len(issues) != 1 else ''}"]
        for issue in issues:
            where = f"{path}: {issue.key}" if issue.key else path
            lines.append(f"{where}: {issue.message}")
            if issue.fix:
                lines.append(f"    fix: {issue.fix}")
        super().__init__("\n".join(lines))


def load(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(path), [ConfigIssue("", "file not found", "check the path given to --config")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [ConfigIssue("", f"cannot read the file: {exc}", "check its permissions and encoding")]) from None
    return loads(text, str(path))


def loads(text: str, path: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [ConfigIssue("", f"not valid TOML: {exc}", "fix the syntax at the line shown")]) from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, [issue for err in exc.errors() for issue in _issues(err)]) from None


def _key(loc: tuple[Any, ...]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if key else str(part)
    return key


def _field_types(model: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(model):
        return {f.name: f.type for f in dataclasses.fields(model)}
    return {name: f.annotation for name, f in getattr(model, "model_fields", {}).items()}


def _model_at(loc: tuple[Any, ...]) -> Any:
    """The model (pydantic or dataclass) that holds the key at ``loc``'s end; None when it cannot be told."""
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        annotation = _field_types(model).get(part)
        model = _model_in(annotation) if annotation is not None else None
        if model is None:
            return None
    return model


def _type_fix(loc: tuple[Any, ...]) -> str:
    """A fix that names the key's default, which has the right type (the package ships no example config)."""
    model, name = _model_at(loc), str(loc[-1]) if loc else ""
    default: Any = dataclasses.MISSING
    if model is not None and dataclasses.is_dataclass(model):
        default = next((f.default for f in dataclasses.fields(model) if f.name == name), dataclasses.MISSING)
    elif model is not None and name in getattr(model, "model_fields", {}):
        field = model.model_fields[name]
        default = dataclasses.MISSING if field.is_required() else field.default
    if default is dataclasses.MISSING or default is None or isinstance(default, (dict, list, BaseModel)):
        return f"write {name} with the type the README's configuration table gives"
    shown = json.dumps(str(default)) if isinstance(default, (str, Path)) else repr(default).lower() if isinstance(default, bool) else repr(default)
    return f"write it like its default: {name} = {shown}"


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _issues(err: Any) -> list[ConfigIssue]:
    """One pydantic error as config issues: a validator's ``Problems`` are several."""
    message = str(err["msg"])
    if err["type"] == "value_error" and "\x00" in message:
        key = _key(_location(err))
        return [ConfigIssue(key, *text.split("\x00", 1)) for text in message.removeprefix("Value error, ").split("\x01")]
    return [_issue(err)]


def _location(err: Any) -> tuple[Any, ...]:
    # drop pydantic's union-member tags ("int", "list[…]") from the location
    return tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in ("int", "str", "float"))))


def _issue(err: Any) -> ConfigIssue:
    loc = _location(err)
    key = _key(loc)
    kind = err["type"]
    message = str(err["msg"])
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        holder = _model_at(loc)
        known = list(_field_types(holder)) if holder is not None else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else ("known keys: " + ", ".join(known) if known else "remove it")
        return ConfigIssue(key, "unknown key", fix)
    if kind == "missing":
        return ConfigIssue(key, "required key is missing", f"add {loc[-1]} = …")
    value = err.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {_masked(str(loc[-1]) if loc else '', value)})"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return ConfigIssue(key, f"wrong type{shown}: {message.lower()}", _type_fix(loc))
    if kind == "string_pattern_mismatch":
        return ConfigIssue(key, f"invalid value{shown}", PATTERN_FIXES.get(str(loc[-1]), PATTERN_FIXES["name"]))
    return ConfigIssue(key, f"{message}{shown}", _range_fix(kind, err.get("ctx") or {}))


# keys whose values are or may be secrets (or personal: phone numbers): an error never echoes them whole
SECRET_KEYS = ("token", "key", "secret", "password", "sid", "number", "url", "credential")


def _masked(key: str, value: Any) -> str:
    if isinstance(value, str) and any(word in key.lower() for word in SECRET_KEYS):
        if "url" in key.lower():
            return repr(masked_url(value))
        return f"{value[:2]!r}… ({len(value)} characters, the rest not shown)" if len(value) > 2 else "(not shown)"
    return repr(value)


PATTERN_FIXES = {
    "name": "use letters, digits, '.', '_' or '-' (at most 64)",
    "number": "use E.164: '+', the country code and the number, no spaces, e.g. +4915112345678",
    "from_number": "use E.164: '+', the country code and the number, no spaces, e.g. +15017122661",
    "account_sid": "use the Account SID from the Twilio console: AC and 32 hex digits",
    "messaging_service_sid": "use the Messaging Service SID: MG and 32 hex digits",
}


def _range_fix(kind: str, ctx: dict[str, Any]) -> str:
    bounds = {
        "greater_than": "greater than {gt}",
        "greater_than_equal": "at least {ge}",
        "less_than": "less than {lt}",
        "less_than_equal": "at most {le}",
    }
    if kind == "literal_error":
        return f"use one of {ctx.get('expected')}"
    template = bounds.get(kind)
    return f"use a value {template.format(**ctx)}" if template else "see the example config in systemd/guardian.toml"
