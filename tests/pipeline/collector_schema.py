"""The Collector's decoding of a component's config, as far as collector/*.yaml needs it.

The Collector decodes each component's YAML into its Go config struct with mapstructure and
``WeaklyTypedInput`` off (core ``confmap``), and refuses to start on a key the struct does not
have or a value of the wrong type: a YAML integer for a ``string`` field (the loadbalancing
exporter's ``resolver.dns.port``) stops the agent. No Collector runs here, so this checks a
config against a typed table of the fields we use (tests/data/otelcol-contrib-<version>-
fields.yaml), read from each component's source at the pinned release.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

ENV_REF = re.compile(r"^\$\{env:(?P<name>\w+)(?::-(?P<default>[^}]*))?\}$")
# Go's time.ParseDuration: a sequence of decimal numbers with units (a lone 0 too).
DURATION = re.compile(r"^(?:0|(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+)$")
LEAVES = ("string", "int", "uint", "float", "bool", "duration")


def _yaml_scalar(text: str) -> object:
    """What the Collector makes of an env var's text for a non-string field: its YAML value."""
    import yaml

    return yaml.safe_load(text) if text else None


def _leaf_errors(path: str, kind: str, value: object) -> Iterator[str]:
    if isinstance(value, str) and (m := ENV_REF.match(value)):
        if m.group("default") is None:
            return  # set by the deployment; nothing to check here
        if kind == "string":
            return  # the Collector keeps an expanded value's text for a string field
        value = _yaml_scalar(m.group("default"))
    ok = {
        "string": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "uint": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "duration": isinstance(value, str) and bool(DURATION.match(value)),
    }[kind]
    if not ok:
        yield f"{path}: {value!r} ({type(value).__name__}) does not decode into {kind}"


def errors(path: str, schema: Any, value: Any) -> Iterator[str]:
    """Every place where ``value`` would not decode into ``schema`` (see the fields file)."""
    if value is None:
        return  # an absent or empty value leaves the Go zero value / the component's default
    if isinstance(schema, str):
        if schema.startswith("[") and schema.endswith("]"):
            if not isinstance(value, list):
                yield f"{path}: {value!r} is not a list of {schema[1:-1]}"
                return
            for i, item in enumerate(value):
                yield from errors(f"{path}[{i}]", schema[1:-1], item)
            return
        assert schema in LEAVES, f"unknown type {schema!r} in the fields table at {path}"
        yield from _leaf_errors(path, schema, value)
        return
    if isinstance(schema, list):
        (item_schema,) = schema
        if not isinstance(value, list):
            yield f"{path}: {value!r} is not a list"
            return
        for i, item in enumerate(value):
            yield from errors(f"{path}[{i}]", item_schema, item)
        return
    if not isinstance(value, dict):
        yield f"{path}: {value!r} is not a mapping"
        return
    for key, sub in value.items():
        if key not in schema:
            yield f"{path}.{key}: not a field of this component at the pinned release"
            continue
        yield from errors(f"{path}.{key}", schema[key], sub)


def config_errors(config: dict, fields: dict) -> list[str]:
    """Every component of ``config`` checked against ``fields[kind][type]``."""
    out: list[str] = []
    for kind in ("receivers", "processors", "exporters", "connectors", "extensions"):
        for cid, body in (config.get(kind) or {}).items():
            ctype = cid.split("/", 1)[0]
            schema = (fields.get(kind) or {}).get(ctype)
            if schema is None:
                out.append(f"{kind}.{cid}: no typed fields for {ctype!r} in the table")
                continue
            out.extend(errors(f"{kind}.{cid}", schema, body))
    return out
