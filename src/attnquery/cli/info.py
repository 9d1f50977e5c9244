"""``attnquery info``: versions, the learners available to ``--method``, and the experiments of
a configuration."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ._common import load_config, print_json

__all__ = ["register", "run", "DEFAULT_CONFIG"]

#: the configuration ``info`` describes when ``--config`` is not given (noted if absent)
DEFAULT_CONFIG = Path("config/config.yaml")


def register(sub) -> None:
    """Add the ``info`` subcommand to the subparsers ``sub``."""
    i = sub.add_parser("info", help="versions, available learners and configured experiments",
                       description="Print versions, the learners available to --method and the "
                       "experiments of a configuration.")
    i.add_argument("--config", type=Path, default=None,
                   help=f"study configuration (default {DEFAULT_CONFIG}, if there; a --config "
                   "given that does not exist is an error)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=run)


def run(args) -> int:
    """Run ``attnquery info``."""
    from ..extraction import methods
    from ..results import SCHEMA_VERSION
    from ..study.provenance import versions

    info = {
        "versions": versions(),
        "schema_version": SCHEMA_VERSION,
        "methods": {k: _method(m) for k, m in methods().items()},
    }
    cfg_path = DEFAULT_CONFIG if args.config is None else args.config
    if args.config is not None or cfg_path.exists():
        info["config"] = str(cfg_path)
        info["experiments"] = _experiments(load_config(cfg_path))
    else:
        info["config"] = f"{cfg_path} (not found)"
    if args.json:
        print_json(info)
    else:
        _print(info)
    return 0


def _method(m) -> dict:
    """A ``--method``'s class, oracle, availability and description (a plug-in that cannot be
    loaded: no oracle, and why in its description)."""
    try:
        return {"learner": m.cls, "oracle": m.oracle, "available": m.available,
                "description": m.description}
    except ConfigError as exc:
        return {"learner": m.cls, "oracle": None, "available": False,
                "description": f"not available: {exc}"}


def _experiments(cfg) -> dict:
    """Each configured experiment: enabled or not, its cells, jobs and estimated cost."""
    from ..study import study_size
    from ..study.config import check_config, enabled_experiments

    cells = check_config(cfg)
    enabled = enabled_experiments(cfg)
    size = study_size(cfg, cells)
    return {name: {"enabled": name in enabled, "cells": len(cells.get(name, [])),
                   **size.get(name, {})}
            for name in cfg["experiments"]}


def _print(info: dict) -> None:
    v = info["versions"]
    print("attnquery " + v["attnquery"] + f" (result schema version {info['schema_version']})")
    print("  " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "attnquery"))
    print("methods:")
    width = max((len(k) for k in info["methods"]), default=0) + 1  # names of any length
    for k, m in info["methods"].items():
        if m["available"]:
            print(f"  {k:<{width}} {m['learner']} ({m['oracle']} oracle), available: "
                  f"{m['description']}")
        else:  # the description says why (a plug-in that cannot be loaded)
            print(f"  {k:<{width}} {m['learner']}, {m['description']}")
    print(f"config: {info['config']}")
    exps = info.get("experiments", {})
    if exps:
        print("  run from scratch: one job per shard; CPU-hours from each experiment's measured\n"
              "  cost model; runtime requests include the safety factor (config key resources)")
        print(f"  {'experiment':<18} {'state':<8} {'cells':>7} {'jobs':>5} {'CPU-hours':>10} "
              f"{'largest request':>16}")
    for name, e in exps.items():
        if not e["enabled"]:
            print(f"  {name:<18} {'disabled':<8} {e['cells']:>7}")
            continue
        print(f"  {name:<18} {'enabled':<8} {e['cells']:>7} {e['jobs']:>5} "
              f"{e['cpu_hours']:>10.3f} {e['max_request_min']:>12} min")
    on = [e for e in exps.values() if e["enabled"]]
    if on:
        print(f"  {'total':<18} {'':<8} {sum(e['cells'] for e in on):>7} "
              f"{sum(e['jobs'] for e in on):>5} {sum(e['cpu_hours'] for e in on):>10.3f} "
              f"{max(e['max_request_min'] for e in on):>12} min")
