"""jsonschema, loaded without the libraries of its `format` checks until a schema needs them.

`import jsonschema` imports every format-checking library it finds installed (fqdn, idna,
rfc3339-validator, rfc3986-validator, ...), whether or not anything will check a format:
20-40 ms of every `keystone` command and of every worker's start (a seventh of the
instructions `keystone validate` executes), while only schema checks and the check of a
user's JSON Schema need them.
So jsonschema is first imported here with those libraries hidden (its own format module then
registers only the formats that need none), and `format_checker` builds each draft's full
checker on first use from a second, private load of jsonschema's format module made with the
libraries there: the same formats and the same functions as a plain `import jsonschema`
gives (tests/checks/test_json_schema.py compares the two).

Import jsonschema through this module (`from checks.json_schema import jsonschema`). Hiding
works only if this import is jsonschema's first, which holds where it matters: the spec
engine imports it when Django's models are loaded, before any request or execution thread
starts. If something else imported jsonschema first, nothing changes but the cost.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

FORMAT_LIBRARIES = (
    "fqdn",
    "idna",
    "jsonpointer",
    "rfc3339_validator",
    "rfc3986_validator",
    "uri_template",
    "webcolors",
)


def _import_without_format_libraries() -> None:
    if "jsonschema" in sys.modules:
        return
    absent = [name for name in FORMAT_LIBRARIES if name not in sys.modules]
    # A None entry makes `import name` raise ImportError, which jsonschema's format module
    # catches: it skips that library's formats.
    for name in absent:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import jsonschema  # noqa: F401
    finally:
        for name in absent:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]


_import_without_format_libraries()

import jsonschema  # noqa: E402  (loaded above; this binds the name for importers)

__all__ = ["format_checker", "jsonschema"]


@functools.cache
def _complete_format_module() -> ModuleType:
    """jsonschema's format module loaded again, privately (not in sys.modules), with every
    installed format library: its draft checkers have all the formats."""
    spec = importlib.util.find_spec("jsonschema._format")
    if spec is None or spec.loader is None:
        raise ImportError("jsonschema._format not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# JSON Schema's "duration" format (drafts 2019-09 and 2020-12) is RFC 3339 Appendix A's
# grammar. Checked here rather than by the isoduration package, whose import (arrow's with
# it) cost ~25 ms, and which Keystone does not install.
_DURATION_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DURATION_DATE = r"(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)"
_DURATION = re.compile(
    rf"P(?:{_DURATION_DATE}(?:{_DURATION_TIME})?|{_DURATION_TIME}|\d+W)", re.ASCII
)


def _is_duration(instance: object) -> bool:
    return not isinstance(instance, str) or _DURATION.fullmatch(instance) is not None


@functools.cache
def format_checker(validator_class: Any) -> jsonschema.FormatChecker:
    """The format checker of `validator_class`'s draft: every format a plain `import
    jsonschema` registers with the libraries installed (what `validator_class.FORMAT_CHECKER`
    would then be), and "duration" for the drafts that define it. Shared: add no format."""
    from jsonschema import _format

    complete = _complete_format_module()
    names = [
        name
        for name in dir(_format)
        if name.endswith("_format_checker")
        and getattr(_format, name) is validator_class.FORMAT_CHECKER
    ]
    # A validator class made with jsonschema.validators.create keeps its own checker.
    source = getattr(complete, names[0]) if names else validator_class.FORMAT_CHECKER
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(source.checkers)  # format -> (function, exceptions it raises)
    if validator_class in (jsonschema.Draft201909Validator, jsonschema.Draft202012Validator):
        checker.checks("duration")(_is_duration)
    return checker
