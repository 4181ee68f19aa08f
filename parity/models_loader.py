"""Building models from "package.module:factory" specs or built-in pair names, and refusing a
spec whose module plainly lacks its factory before anything runs."""

from __future__ import annotations

import ast
import importlib
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, PathFinder
from pathlib import Path
from typing import Any, Callable, Iterable, List, Optional, Set, Tuple

from parity.errors import ParityInputError, UserCodeFailed, in_one_line, memory_ran_out


def _split(spec: str) -> Tuple[str, str]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ParityInputError(f"factory {spec!r} must look like package.module:factory")
    return module_name, attr


def _cannot_import(spec: str, why: str) -> ParityInputError:
    return ParityInputError(f"cannot import {_split(spec)[0]!r} for {spec!r} ({why}); check the "
                            "name and that it is on PYTHONPATH")


def _no_factory(spec: str) -> ParityInputError:
    module_name, attr = _split(spec)
    return ParityInputError(f"{module_name} has no callable {attr!r} (from {spec!r})")


def load_factory(spec: str) -> Callable[..., Any]:
    module_name, attr = _split(spec)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise _cannot_import(spec, str(error)) from None
    except SystemExit as exited:
        raise ParityInputError(
            f"importing {module_name} for {spec!r} called sys.exit({exited.code!r}): code at "
            "its top level runs on import (parsing a command line, say); put it under "
            "if __name__ == '__main__':") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise _no_factory(spec)
    return factory


def refuse_evidently_missing(spec: str) -> None:
    """Refuse a factory whose module, or the factory in it, plainly does not exist, judged
    from the files on the path and the module's source without importing it: ``parity run``
    checks the MindSpore side's so, before the torch capture, which runs first and can take
    minutes (importing the module would load MindSpore into parity's own process). Whatever
    it cannot be sure of (an import hook, a namespace or compiled module, a star import, a
    module ``__getattr__``, ``globals()``) is left to the capture."""
    module_name, attr = _split(spec)
    source = _module_source(module_name, spec)
    if source is None:
        return
    try:
        names = _top_level_names(ast.parse(source.read_bytes(), filename=str(source)).body)
    except (OSError, SyntaxError, ValueError):
        return
    if names is not None and attr not in names:
        raise _no_factory(spec)


# Top-level packages holding one framework's models: a factory from one of them given for the
# other side (the two options swapped, the torch model named twice) is refused before anything
# runs, instead of after the torch capture.
FRAMEWORK_PACKAGES = {"torch": ("torch", "torchvision", "timm"),
                      "mindspore": ("mindspore", "mindcv")}
# How messages name each framework, and the option that takes its model's factory.
FRAMEWORK_NAMES = {"torch": "torch", "mindspore": "MindSpore"}
MODEL_OPTIONS = {"torch": "--torch-model", "mindspore": "--ms-model"}


def refuse_the_other_frameworks(spec: str, framework: str) -> None:
    """Refuse ``spec`` as ``framework``'s model factory when its package is the other's."""
    package = _split(spec)[0].partition(".")[0]
    name = FRAMEWORK_NAMES[framework]
    for other, packages in FRAMEWORK_PACKAGES.items():
        if other != framework and package in packages:
            raise ParityInputError(
                f"the {name} model's factory {spec} comes from {package}, a "
                f"{FRAMEWORK_NAMES[other]} package: give the {name} model's as "
                f"{MODEL_OPTIONS[framework]} (the two swapped?)")


def _module_source(module_name: str, spec: str) -> Optional[Path]:
    """The ``.py`` file a fresh process started in this directory would import for
    ``module_name`` (import's own order: a finder ahead of the path's, then along the path a
    package, an extension module, a source file, namespace packages last), or None when that
    is not a source file parity can be sure of. A module no finder can supply is refused."""
    parts = module_name.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    finders = list(sys.meta_path)
    path_finder = finders.index(PathFinder) if PathFinder in finders else len(finders)
    if _found_by(finders[:path_finder], parts[0]):          # built-in, frozen, a hook
        return None
    search: List[str] = [os.getcwd(), *sys.path[1:]]        # sys.path[0]: this script's folder
    for depth, part in enumerate(parts):
        found = _find_on(search, part)
        if found is None and (depth or not _found_by(finders[path_finder + 1:], part)):
            raise _cannot_import(spec, f"no module named {'.'.join(parts[:depth + 1])!r}")
        if depth == len(parts) - 1:
            return found if found is not None and found.suffix == ".py" else None
        if found is None or found.name != "__init__.py" or _extends_itself(found):
            return None             # a hook's, a namespace or not a package: import tells
        search = [str(found.parent)]
    return None


def _found_by(finders: Iterable[Any], name: str) -> bool:
    """Whether one of these import finders supplies top-level module ``name`` (a failing one
    counts as supplying it: import will tell)."""
    for finder in finders:
        try:
            if finder.find_spec(name, None) is not None:
                return True
        except Exception:
            return True
    return False


def _extends_itself(init: Path) -> bool:
    """Whether a package's ``__init__`` may supply submodules its folder does not hold (it
    touches its ``__path__`` or ``sys.modules``, or defines ``__getattr__``)."""
    try:
        text = init.read_text(errors="replace")
    except OSError:
        return True
    return any(word in text for word in ("__path__", "sys.modules", "__getattr__"))


def _find_on(search: Iterable[str], name: str) -> Optional[Path]:
    """Where ``name`` is found first along ``search``: a package's ``__init__`` or a module file
    (an extension or bytecode one, an archive that may hold it, or a namespace package's first
    folder, returned as such); None when nowhere."""
    namespace = None
    for entry in search:
        folder = Path(entry or os.getcwd())
        if not folder.is_dir():
            if folder.exists():         # an archive on the path (a zip): not read here
                return folder
            continue
        package = folder / name
        if package.is_dir():
            initial = sorted(package.glob("__init__.*"))
            if initial:
                return next((p for p in initial if p.name == "__init__.py"), initial[0])
            namespace = namespace or package
        for suffix in (*EXTENSION_SUFFIXES, ".py", ".pyc"):
            if (folder / f"{name}{suffix}").is_file():
                return folder / f"{name}{suffix}"
    return namespace


# Calls that can bind module names the source does not spell out
_DYNAMIC = {"globals", "vars", "exec", "eval"}


class _Open(Exception):
    """The module's code may bind names its source does not spell out."""


def _top_level_names(body: Iterable[ast.stmt]) -> Optional[Set[str]]:
    """The names the module's own scope binds (functions' and classes' own names, assignments
    and imports outside them, ``global`` declarations), or None when its code may bind others:
    a star import, ``globals()``, ``exec``, ``setattr`` on anything but ``self``, a module
    ``__getattr__``, a replaced ``sys.modules`` entry."""
    names: Set[str] = set()

    def visit(node: ast.AST, module_scope: bool) -> None:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            raise _Open
        if isinstance(node, ast.Call):
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called in _DYNAMIC or (called == "setattr" and not (
                    node.args and getattr(node.args[0], "id", "") in ("self", "cls"))):
                raise _Open
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                getattr(node.value, "attr", "") == "modules":
            raise _Open
        inner = module_scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            name = getattr(node, "name", None)
            if module_scope and name:
                if name == "__getattr__":
                    raise _Open
                names.add(name)
            inner = False
        elif isinstance(node, ast.Global):
            names.update(node.names)
        elif module_scope and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif module_scope and isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    try:
        for statement in body:
            visit(statement, True)
    except _Open:
        return None
    return names


def _made_by(spec: str, what: str, **arguments: Any) -> Any:
    """What the factory ``spec`` returns; its own failure (a bug in it, a model too large for
    memory) told in one line as the factory's, not as parity's."""
    factory = load_factory(spec)
    try:
        return factory(**arguments)
    except ParityInputError:
        raise
    except (Exception, SystemExit) as error:
        called = f"{spec}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
        if memory_ran_out(error):
            raise ParityInputError(
                f"{called} ran out of memory building the {what}: {in_one_line(error)}; the "
                "model itself does not fit: check the sizes it is built with") from error
        raise UserCodeFailed(f"{called} failed building the {what}: {in_one_line(error)}; "
                             "call it alone to fix it") from error


def _build(spec: str, num_classes: Optional[int], what: str) -> Any:
    from models import is_builtin_factory
    if is_builtin_factory(spec) and num_classes is not None:
        return _made_by(spec, what, num_classes=num_classes)
    return _made_by(spec, what)


def build_torch_model(spec: str, num_classes: Optional[int] = None) -> Any:
    import torch
    model = _build(spec, num_classes, "torch model")
    if not isinstance(model, torch.nn.Module):
        raise ParityInputError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def build_mindspore_model(spec: str, num_classes: Optional[int] = None) -> Any:
    import mindspore  # noqa: F401  (imported before anything pulls in torch; see DESIGN.md)
    from mindspore import nn
    model = _build(spec, num_classes, "MindSpore model")
    if not isinstance(model, nn.Cell):
        raise ParityInputError(f"{spec} returned {type(model).__name__}, not a mindspore.nn.Cell")
    return model


def build_loss(spec: str) -> Callable[..., Any]:
    """A --torch-loss / --ms-loss factory's loss: called as ``loss(outputs, labels)``."""
    loss = _made_by(spec, "loss")
    if not callable(loss):
        raise ParityInputError(f"{spec} returned {type(loss).__name__}, which is not callable "
                               "as loss(outputs, labels)")
    return loss
