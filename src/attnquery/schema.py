"""The study configuration's JSON schema (``config/schema.yaml``): the one home of its defaults.

Every default of the configuration is written in the schema, and nowhere else: a validator
extended to fill defaults (the ``extend_with_default`` recipe of jsonschema's FAQ, which is
also what ``snakemake.utils.validate(..., set_default=True)`` does) writes them into the config
while it validates it. Unlike Snakemake's, this one follows ``$ref``: a property defined by
reference (``enabled: {$ref: "#/$defs/common/enabled"}``) gets the default of the definition it
names.

:func:`attnquery.study.config.validate_config` fills the whole config;
:func:`section_with_defaults` fills one experiment's section (what
:func:`attnquery.experiments.expand_cells` expands, so that a section given in code, as the
tests do, gets the same defaults as one read from a file).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from pathlib import Path

import yaml

__all__ = ["default_schema_path", "load_schema", "defaults_validator", "fill_defaults",
           "section_with_defaults"]


def default_schema_path() -> Path:
    """``config/schema.yaml`` of the source tree (or of the current directory)."""
    here = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"
    return here if here.exists() else Path("config/schema.yaml")


@functools.cache
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def load_schema(path=None) -> dict:
    """The schema at ``path`` (default :func:`default_schema_path`), parsed once per process;
    a deep copy, so a caller may change it."""
    return copy.deepcopy(_load(str(Path(path or default_schema_path()).resolve())))


def _deref(sub: Mapping, root: Mapping) -> Mapping:
    """A property's schema with a local ``$ref`` resolved (its own keys win)."""
    if "$ref" not in sub:
        return sub
    node = root
    for part in sub["$ref"].lstrip("#/").split("/"):
        node = node[part]
    return {**_deref(node, root), **{k: v for k, v in sub.items() if k != "$ref"}}


def defaults_validator(schema: Mapping):
    """A Draft 2020-12 validator of ``schema`` that fills the defaults of missing properties
    (deep copies, following local ``$ref``) into the instance it validates."""
    from jsonschema import Draft202012Validator, validators

    validate_properties = Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema_):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                sub = _deref(sub, schema)
                if name not in instance and "default" in sub:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema_)

    cls = validators.extend(Draft202012Validator, {"properties": set_defaults})
    return cls(schema)


def fill_defaults(cfg: dict, schema: Mapping | None = None) -> list:
    """Fill the schema's defaults into ``cfg`` in place; return the validation errors (sorted
    by where they are)."""
    schema = load_schema() if schema is None else schema
    return sorted(defaults_validator(schema).iter_errors(cfg),
                  key=lambda e: [str(p) for p in e.absolute_path])


def section_with_defaults(name: str, section: Mapping) -> dict:
    """A copy of experiment ``name``'s config section with the schema's defaults filled in
    (the section as it is when the schema does not know the experiment)."""
    out = copy.deepcopy(dict(section))
    schema = _load(str(default_schema_path().resolve()))
    if name not in schema["properties"]["experiments"]["properties"]:
        return out
    fill_defaults({"seed": 0, "experiments": {name: out}}, schema)
    return out
