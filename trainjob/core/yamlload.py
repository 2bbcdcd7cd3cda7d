"""Manifest text to YAML documents, as strictly as a Kubernetes client reads them: a key given
twice is an error (PyYAML keeps the last silently), and aliases that expand beyond any
manifest's size are refused before anything renders them."""

from __future__ import annotations

from typing import Any, Final

import yaml


class YamlError(ValueError):
    """Text that is not YAML a Kubernetes client would accept; the message names the source."""


MAX_YAML_NODES: Final = 1_000_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping, as kubectl does (PyYAML keeps
    the last value silently, so `worker:` twice would run with the second one)."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes a document has once its aliases are expanded (memoised: aliases share
    nodes, so this stays cheap while the number it computes can be astronomical)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, sizes) + _expanded_size(value, sizes)
    sizes[id(node)] = size
    return size


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; construct_mapping reports it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _no_duplicate_keys,
)


def load_documents(text: str, source: str) -> list[Any]:
    """Every non-empty YAML document of `text`; YamlError naming `source` (a file name, or
    `<stdin>`) and the line when it is not valid YAML or repeats a key."""
    loader = _StrictLoader(text)
    # Marks in messages then say `in "job.yaml", line 3` instead of `<unicode string>`.
    loader.name = source
    documents: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None and _expanded_size(node, {}) > MAX_YAML_NODES:
                # Nested aliases ("billion laughs") would expand when the job is rendered.
                raise YamlError(
                    f"{source}: its aliases (*name) expand to more than {MAX_YAML_NODES:,} "
                    "values; no manifest needs that"
                )
            document = loader.construct_document(node)
            if document is not None:
                documents.append(document)
    except yaml.YAMLError as error:
        raise YamlError(f"{source} is not valid YAML: {error}") from error
    except RecursionError as error:  # `[[[[...` thousands deep: no manifest nests like that
        raise YamlError(f"{source} is nested too deeply to be a manifest") from error
    finally:
        loader.dispose()
    return documents
