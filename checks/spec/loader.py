"""YAML loading that keeps the line and column of every node.

PyYAML's constructors drop positions, so we compose the node tree ourselves and build
the Python data while recording, for every path, where its key and its value start.
Duplicate keys are reported instead of silently keeping the last one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

# A path into the document: mapping keys and list indexes, from the root.
Path = tuple[Any, ...]

# Far above any real spec; stops alias bombs ("billion laughs") from expanding forever.
MAX_NODES = 200_000
# Bounds checked on the text before any parser sees it: a parser crash (a C loader hit by
# 60 KB of `[[[[`) would take the whole server down, and a spec this large is a mistake.
MAX_SPEC_BYTES = 1_000_000
MAX_FLOW_DEPTH = 100  # nested [ ] and { }
MAX_INDENT = 400  # columns of leading spaces (block nesting)


class Mark(NamedTuple):
    # A NamedTuple because one is made per node: it is several times cheaper than a dataclass.
    line: int  # 1-based
    column: int  # 1-based

    @classmethod
    def from_yaml(cls, mark: yaml.Mark | None) -> Mark:
        if mark is None:
            return cls(1, 1)
        return cls(mark.line + 1, mark.column + 1)


@dataclass(slots=True)
class LoadProblem:
    """A problem met while reading the YAML (a duplicate key, an unreadable value, a parser
    error), with its path and where it is written."""

    path: Path
    message: str
    mark: Mark


@dataclass(slots=True)
class LoadedYaml:
    """A parsed YAML document: the data, where each path's key and value are written, and the
    problems met."""

    data: Any
    value_marks: dict[Path, Mark] = field(default_factory=dict)
    key_marks: dict[Path, Mark] = field(default_factory=dict)
    problems: list[LoadProblem] = field(default_factory=list)

    def mark_for(self, path: Path, *, prefer_key: bool = False) -> Mark:
        """Where `path` is written; for a path that isn't in the document, its nearest parent."""
        probe = tuple(path)
        while True:
            if prefer_key and probe in self.key_marks:
                return self.key_marks[probe]
            if probe in self.value_marks:
                return self.value_marks[probe]
            if not probe:
                return Mark(1, 1)
            probe = probe[:-1]


# The C parser is several times faster; positions and errors are the same.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _TooLarge(Exception):
    pass


class _Builder:
    """Turns a composed node tree into plain data, recording marks and problems."""

    def __init__(self, loader: yaml.SafeLoader, result: LoadedYaml) -> None:
        self.loader = loader
        self.result = result
        self.nodes_seen = 0
        self.active: set[int] = set()

    def build(self, node: yaml.Node, path: Path) -> Any:
        self.nodes_seen += 1
        if self.nodes_seen > MAX_NODES:
            raise _TooLarge
        self.result.value_marks.setdefault(path, Mark.from_yaml(node.start_mark))
        if id(node) in self.active:
            # An alias that contains itself; no spec needs one and it can't become JSON.
            self._problem(path, "recursive YAML alias is not allowed", node.start_mark)
            return None
        self.active.add(id(node))
        try:
            if (
                isinstance(node, yaml.MappingNode | yaml.SequenceNode)
                and node.tag not in _PLAIN_COLLECTION_TAGS
            ):
                # SafeLoader refuses tags like !!python/tuple or !!set; so do we, but keep going.
                tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
                self._problem(path, f"unsupported YAML tag '{tag}'", node.start_mark)
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
            return self._scalar(node, path)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[Any, Any]:
        # Resolves `<<: *anchor` merge keys the way SafeLoader does.
        self.loader.flatten_mapping(node)
        data: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self._problem(
                    path,
                    "a mapping key must be a plain value, not a list or mapping",
                    key_node.start_mark,
                )
                continue
            key = self._scalar(key_node, path)
            if not isinstance(key, str):
                # YAML turns `1:` or `null:` into non-string keys; specs only use names.
                key = str(key_node.value)
            child = (*path, key)
            if key in data:
                first = self.result.key_marks.get(child)
                where = (
                    f" (first defined at line {first.line}, col {first.column})" if first else ""
                )
                self._problem(child, f"duplicate key '{key}'{where}", key_node.start_mark)
                continue
            self.result.key_marks[child] = Mark.from_yaml(key_node.start_mark)
            data[key] = self.build(value_node, child)
        return data

    def _scalar(self, node: yaml.Node, path: Path = ()) -> Any:
        # The tag's constructor directly: construct_object's bookkeeping is for collections.
        constructor = self.loader.yaml_constructors.get(node.tag)
        try:
            if constructor is None:
                return self.loader.construct_object(node, deep=True)  # the usual unknown-tag error
            value = constructor(self.loader, node)
            if isinstance(value, float) and not math.isfinite(value):
                # .nan and .inf are YAML floats, but no weight, threshold or limit means them
                # (and JSON, where specs are stored, has no such number).
                self._problem(path, f"{node.value} is not a finite number", node.start_mark)
                return None
            return value
        except yaml.MarkedYAMLError as exc:
            self._problem(path, _yaml_error_text(exc), exc.problem_mark or node.start_mark)
        except Exception as exc:  # e.g. `!!int abc`: the tag's constructor rejects the text
            tag = str(node.tag).removeprefix("tag:yaml.org,2002:")
            self._problem(
                path, f"cannot read {_short_value(node)} as !!{tag}: {exc}", node.start_mark
            )
        return None

    def _problem(self, path: Path, message: str, mark: yaml.Mark | None) -> None:
        self.result.problems.append(LoadProblem(path, message, Mark.from_yaml(mark)))


def load_yaml(text: str) -> LoadedYaml:
    """Parse one YAML document. Never raises for bad input: problems are in the result."""
    result = LoadedYaml(data=None)
    refused = _refuse_before_parsing(text)
    if refused is not None:
        result.problems.append(refused)
        return result
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return result
        result.data = _Builder(loader, result).build(node, ())
    except yaml.MarkedYAMLError as exc:
        result.data = None
        mark = exc.problem_mark or exc.context_mark
        result.problems.append(LoadProblem((), _yaml_error_text(exc), Mark.from_yaml(mark)))
    except yaml.YAMLError as exc:
        result.data = None
        result.problems.append(
            LoadProblem((), f"invalid YAML: {_reader_text(exc)}", _reader_mark(exc, text))
        )
    except _TooLarge:
        result.data = None
        result.problems.append(
            LoadProblem(
                (),
                f"the document expands to more than {MAX_NODES} nodes (too many aliases?)",
                Mark(1, 1),
            )
        )
    except RecursionError:
        result.data = None
        result.problems.append(LoadProblem((), "the document is nested too deeply", Mark(1, 1)))
    finally:
        loader.dispose()
    return result


def _refuse_before_parsing(text: str) -> LoadProblem | None:
    """A problem when the text is too large or nested too deeply to hand to a parser."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_SPEC_BYTES:
        return LoadProblem(
            (), f"the spec is {size:,} bytes; the limit is {MAX_SPEC_BYTES:,} bytes", Mark(1, 1)
        )
    depth = 0
    for line_number, line in enumerate(text.splitlines(), start=1):
        indent = len(line) - len(line.lstrip(" "))
        if indent > MAX_INDENT:
            return LoadProblem(
                (), f"nested too deeply: {indent} columns of indentation", Mark(line_number, 1)
            )
        quote = ""
        for column, char in enumerate(line, start=1):
            if quote:
                quote = "" if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "#" and (column == 1 or line[column - 2] in " \t"):
                break  # a comment: the rest of the line is not YAML
            elif char in "[{":
                depth += 1
                if depth > MAX_FLOW_DEPTH:
                    return LoadProblem(
                        (),
                        f"nested too deeply: more than {MAX_FLOW_DEPTH} levels of [ ] or {{ }}",
                        Mark(line_number, column),
                    )
            elif char in "]}":
                depth = max(0, depth - 1)
    return None


def _yaml_error_text(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or "syntax error"
    if exc.context and exc.problem_mark is not None:
        # The error is reported where the parser gave up; say where the construct began.
        began = Mark.from_yaml(exc.context_mark) if exc.context_mark is not None else None
        where = f" at line {began.line}, col {began.column}" if began else ""
        return f"invalid YAML: {problem} ({exc.context}{where})"
    return "invalid YAML: " + ", ".join(p for p in (exc.context, exc.problem) if p)


def _short_value(node: yaml.Node) -> str:
    text = str(node.value)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _reader_text(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.reader.ReaderError):
        char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        return f"character {char!r} is not allowed in YAML ({exc.reason})"
    return str(exc)


def _reader_mark(exc: yaml.YAMLError, text: str) -> Mark:
    # ReaderError (e.g. a control character) carries a character index, not a mark.
    position = getattr(exc, "position", None)
    if not isinstance(position, int) or position < 0:
        return Mark(1, 1)
    before = text[:position]
    line = before.count("\n") + 1
    return Mark(line, position - (before.rfind("\n") + 1) + 1)
