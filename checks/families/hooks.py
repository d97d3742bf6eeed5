"""`python_hook`: a Python callable decides (reference 003). It runs in the server's process,
so it is refused unless the security policy's allow_python_hooks switch is on."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    get_optional_str,
    get_str,
    guarded,
    resolve_inside,
    verdict_from,
)
from checks.results import Outcome


def load_hook(config: dict[str, Any], context: CheckContext) -> Callable[..., Any]:
    path = get_optional_str(config, "path")
    import_path = get_optional_str(config, "import_path")
    callable_name = get_str(config, "callable_name")
    if (path is None) == (import_path is None):
        raise ConfigError("exactly one of 'path' or 'import_path' is required")
    try:
        if path is not None:
            source = resolve_inside(context.spec_dir, path, "path")
            if not source.is_file():
                raise ConfigError(f"hook file {path!r} not found next to the spec")
            # A unique module name per file, so two specs' check.py files do not collide.
            module_name = "keystone_hook_" + hashlib.sha1(str(source).encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(module_name, source)
            if spec is None or spec.loader is None:
                raise ConfigError(f"cannot load {path!r} as a Python module")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            assert import_path is not None
            module = importlib.import_module(import_path)
    except ConfigError:
        raise
    except Exception as exc:  # the hook's module itself is broken
        raise ConfigError(f"loading the hook failed: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, callable_name, None)
    if not callable(function):
        raise ConfigError(f"{callable_name!r} is not a callable in {path or import_path}")
    return function


class PythonHookCheck(Check):
    type = "python_hook"
    reads_workspace = True

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        if not context.policy.allow_python_hooks:
            raise ConfigError(
                "python hooks are disabled by the server's security policy: set"
                " KEYSTONE_ALLOW_PYTHON_HOOKS=1 to allow them"
            )
        function = load_hook(self.config, context)
        name = self.config.get("callable_name")
        try:
            result = function(artifact, context)
        except Exception as exc:  # the hook's bug: no verdict, not a failed agent
            raise ConfigError(f"hook {name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(result, bool):
            return verdict_from({"passed": result, "reason": f"hook {name} returned {result}"})
        if isinstance(result, dict) and isinstance(result.get("passed"), bool):
            return verdict_from(result)
        raise ConfigError(
            f"hook {name} returned {type(result).__name__}; expected bool or dict with 'passed'"
        )


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (PythonHookCheck,)
