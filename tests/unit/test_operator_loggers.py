"""Every operator module logs under its own module name (`logging.getLogger(__name__)`), so
a log line says where it came from and a logger's name is spelled in one place: the module's."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import trainjob_operator


def test_every_operator_logger_is_named_after_its_module() -> None:
    found = 0
    for info in pkgutil.iter_modules(trainjob_operator.__path__):
        name = f"{trainjob_operator.__name__}.{info.name}"
        module = importlib.import_module(name)
        logger = getattr(module, "logger", None)
        if isinstance(logger, logging.Logger):
            found += 1
            assert logger.name == name, f"{name} logs as {logger.name!r}"
    assert found >= 10, found
