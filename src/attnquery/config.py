"""Study configuration: loading, JSON-schema validation and the checks a schema cannot express.

The schema lives in ``config/schema.yaml``; the workflow validates with
``snakemake.utils.validate`` and then calls :func:`check_config`, which expands every enabled
experiment's grid so that a bad value (an empty grid, a rank larger than d, ...) stops the run
before any job starts, with a message naming the key.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import ConfigError

__all__ = ["load_config", "validate_config", "check_config", "enabled_experiments",
           "default_schema_path"]


def default_schema_path() -> Path:
    """``config/schema.yaml`` of the source tree (or of the current directory)."""
    here = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"
    return here if here.exists() else Path("config/schema.yaml")


def load_config(path) -> dict:
    """Read a YAML config file, validate it and return it (with schema defaults filled in)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    try:
        with open(p, encoding="utf-8") as fh:
            cfg = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise ConfigError(f"config file {p} is not valid YAML{at}: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p} cannot be read: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    validate_config(cfg)
    check_config(cfg)
    return cfg


def _fill_defaults(instance, schema, root):
    if not isinstance(instance, dict):
        return
    if "$ref" in schema:
        schema = _resolve(schema["$ref"], root)
    for key, sub in schema.get("properties", {}).items():
        if "$ref" in sub:
            sub = {**_resolve(sub["$ref"], root), **{k: v for k, v in sub.items() if k != "$ref"}}
        if key not in instance and "default" in sub:
            instance[key] = sub["default"]
        if key in instance:
            _fill_defaults(instance[key], sub, root)


def _resolve(ref: str, root):
    node = root
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


def validate_config(cfg: dict, schema_path=None) -> dict:
    """Validate ``cfg`` against the JSON schema; fill defaults in place; return it."""
    import jsonschema

    schema_path = Path(schema_path or default_schema_path())
    with open(schema_path, encoding="utf-8") as fh:
        schema = yaml.safe_load(fh)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors:
            where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
            lines.append(f"{where}: {e.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    _fill_defaults(cfg, schema, schema)
    return cfg


def enabled_experiments(cfg: dict) -> list[str]:
    """Names of the enabled experiments, in config order."""
    return [k for k, v in cfg["experiments"].items() if v.get("enabled", True)]


def check_config(cfg: dict) -> dict[str, list]:
    """Expand every enabled experiment's grid; raise ConfigError naming the key on failure.

    Returns the cells of each enabled experiment.
    """
    from .experiments import expand_cells

    out = {}
    names = enabled_experiments(cfg)
    if not names:
        raise ConfigError("experiments: no experiment is enabled")
    for name in names:
        try:
            out[name] = expand_cells(name, cfg["experiments"][name])
        except ConfigError as exc:
            msg = str(exc)
            prefix = f"experiments.{name}"
            raise ConfigError(msg if msg.startswith(prefix) else f"{prefix}: {msg}") from None
    return out
