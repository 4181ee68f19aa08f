"""Building models from "package.module:factory" specs or built-in pair names."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Optional

from parity.errors import ParityInputError


def load_factory(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ParityInputError(f"factory {spec!r} must look like package.module:factory")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ParityInputError(f"cannot import {module_name!r} for {spec!r} ({error}); "
                               "check the name and that it is on PYTHONPATH") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ParityInputError(f"{module_name} has no callable {attr!r} (from {spec!r})")
    return factory


def _build(spec: str, num_classes: Optional[int]) -> Any:
    from models import is_builtin_factory
    factory = load_factory(spec)
    if is_builtin_factory(spec) and num_classes is not None:
        return factory(num_classes=num_classes)
    return factory()


def build_torch_model(spec: str, num_classes: Optional[int] = None) -> Any:
    import torch
    model = _build(spec, num_classes)
    if not isinstance(model, torch.nn.Module):
        raise ParityInputError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_mindspore_model(spec: str, num_classes: Optional[int] = None) -> Any:
    import mindspore  # noqa: F401  (imported before anything pulls in torch; see DESIGN.md)
    from mindspore import nn
    model = _build(spec, num_classes)
    if not isinstance(model, nn.Cell):
        raise ParityInputError(f"{spec} returned {type(model).__name__}, not a mindspore.nn.Cell")
    return model


def build_loss(spec: str) -> Callable[..., Any]:
    """A --torch-loss / --ms-loss factory's loss: called as ``loss(outputs, labels)``."""
    loss = load_factory(spec)()
    if not callable(loss):
        raise ParityInputError(f"{spec} returned {type(loss).__name__}, which is not callable "
                               "as loss(outputs, labels)")
    return loss
