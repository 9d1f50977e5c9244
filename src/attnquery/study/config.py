"""Study configuration: loading, JSON-schema validation and the checks a schema cannot express.

The schema lives in ``config/schema.yaml``; the workflow validates with
``snakemake.utils.validate`` and then calls :func:`check_config`, which expands every enabled
experiment's grid so that a bad value (an empty grid, a rank larger than d, ...) stops the run
before any job starts, with a message naming the key.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError
from ..schema import default_schema_path, fill_defaults, section_with_defaults

__all__ = ["load_config", "validate_config", "check_config", "enabled_experiments",
           "default_schema_path"]


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


def validate_config(cfg: dict, schema_path=None) -> dict:
    """Validate ``cfg`` against the JSON schema, filling its defaults in place
    (:mod:`attnquery.schema`: the schema is the one home of the defaults); return it."""
    from ..schema import defaults_validator, load_schema

    validator = defaults_validator(load_schema(schema_path))
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors:
            where = ".".join(str(p) for p in e.absolute_path) or "(top level)"
            lines.append(f"{where}: {e.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    return cfg


def enabled_experiments(cfg: dict) -> list[str]:
    """Names of the enabled experiments, in config order (``enabled`` as given, else the
    schema's default)."""
    return [k for k, v in cfg["experiments"].items() if section_with_defaults(k, v)["enabled"]]


def check_config(cfg: dict) -> dict[str, list]:
    """Expand every enabled experiment's grid; raise ConfigError naming the key on failure.

    Fills the schema's defaults into ``cfg`` first (in place: the workflow's config is then
    complete, ``$ref``-defined defaults included, which ``snakemake.utils.validate`` leaves out).
    Returns the cells of each enabled experiment.
    """
    from ..experiments import expand_cells

    fill_defaults(cfg)
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
