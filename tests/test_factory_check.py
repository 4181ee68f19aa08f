"""``parity run`` refuses a --ms-model or --ms-loss whose module, or the factory in it, plainly
does not exist before the torch capture (which runs first and can take minutes), judging from
the files on the path and the module's source without importing it; whatever it cannot be sure
of is left to the MindSpore capture."""

from __future__ import annotations

import importlib.machinery
import sys
import textwrap

import pytest

from parity.errors import ParityInputError
from parity.models_loader import refuse_evidently_missing
from tests.conftest import REPO, parity_cli


def test_a_misspelt_factory_is_refused_and_a_defined_one_is_not(monkeypatch):
    monkeypatch.chdir(REPO)
    refuse_evidently_missing("tests.tiny:ms_tiny")
    with pytest.raises(ParityInputError) as refused:
        refuse_evidently_missing("tests.tiny:ms_tinyy")
    assert str(refused.value) == ("tests.tiny has no callable 'ms_tinyy' "
                                  "(from 'tests.tiny:ms_tinyy')")


# Sources that bind ``factory`` or may: none is refused.
BINDING = {
    "def": "def factory(): pass",
    "class": "class factory: pass",
    "assignment": "factory = lambda: None",
    "tuple assignment": "other, factory = 1, 2",
    "import": "from os import getcwd as factory",
    "in a block": "try:\n    import nothing_here\nexcept ImportError:\n    factory = None",
    "global": "def make():\n    global factory\n    factory = 1\nmake()",
    "star import": "from os.path import *",
    "globals()": "globals()['fact' + 'ory'] = print",
    "module __getattr__": "def __getattr__(name):\n    return print",
    "setattr on the module": "import sys\nsetattr(sys.modules[__name__], 'factory', print)",
    "replaced module": "import sys\nsys.modules[__name__] = object()",
    "exec": "exec('factory = print')",
}


@pytest.mark.parametrize("source", BINDING.values(), ids=BINDING.keys())
def test_a_source_that_binds_the_factory_or_may_is_left_alone(tmp_path, monkeypatch, source):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(source + "\n")
    refuse_evidently_missing("nets:factory")


def test_a_source_that_binds_it_nowhere_is_refused_whatever_else_it_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "nets.py").write_text(textwrap.dedent("""
        import os.path
        class Net:
            def __init__(self):
                setattr(self, "factory", 1)
            def __getattr__(self, name):
                return name
        def make_net():
            factory = Net()
            return factory
        """))
    with pytest.raises(ParityInputError, match="pkg.nets has no callable 'factory'"):
        refuse_evidently_missing("pkg.nets:factory")


def test_a_module_no_finder_supplies_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import os\n")
    for spec, missing in (("absent:factory", "absent"), ("pkg.nets:factory", "pkg.nets"),
                          ("absent.nets:factory", "absent")):
        with pytest.raises(ParityInputError) as refused:
            refuse_evidently_missing(spec)
        module = spec.partition(":")[0]
        assert str(refused.value) == (f"cannot import {module!r} for {spec!r} (no module named "
                                      f"{missing!r}); check the name and that it is on PYTHONPATH")


class _Supplies:
    """An import hook after the path's, as an editable install adds: it supplies ``hooked``."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, None) if name == "hooked" else None


def test_modules_it_cannot_be_sure_of_are_left_to_the_capture(tmp_path, monkeypatch):
    """Compiled, bytecode only, in a namespace package, not valid Python, supplied by an
    import hook, or in a package that extends itself: the capture imports it and says what is
    wrong."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, _Supplies])
    (tmp_path / "lazy").mkdir()
    (tmp_path / "lazy" / "__init__.py").write_text("def __getattr__(name):\n    return name\n")
    (tmp_path / "compiled.py").write_text("")
    (tmp_path / "compiled.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "bytecode.pyc").write_bytes(b"")
    (tmp_path / "space").mkdir()
    (tmp_path / "space" / "nets.py").write_text("")
    (tmp_path / "broken.py").write_text("def (:\n")
    for spec in ("compiled:factory", "bytecode:factory", "space.nets:factory", "space:factory",
                 "broken:factory", "hooked:factory", "lazy.nets:factory"):
        refuse_evidently_missing(spec)


def test_parity_run_refuses_a_misspelt_ms_model_before_capturing_anything(tmp_path):
    process = parity_cli("run", "--torch-model", "tests.tiny:torch_tiny", "--ms-model",
                         "tests.tiny:ms_tinyy", "--image-size", "16", "--out", tmp_path / "run")
    assert process.returncode == 2
    assert process.stderr.strip() == ("parity: error: tests.tiny has no callable 'ms_tinyy' "
                                      "(from 'tests.tiny:ms_tinyy')")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("torch_model, ms_model, said", [
    ("tests.tiny:torch_tiny", "torchvision.models:resnet18",
     "the MindSpore model's factory torchvision.models:resnet18 comes from torchvision, a torch "
     "package: give the MindSpore model's as --ms-model (the two swapped?)"),
    ("mindspore.nn:Dense", "tests.tiny:ms_tiny",
     "the torch model's factory mindspore.nn:Dense comes from mindspore, a MindSpore package: "
     "give the torch model's as --torch-model (the two swapped?)"),
])
def test_parity_run_refuses_a_factory_of_the_other_framework_at_once(tmp_path, torch_model,
                                                                       ms_model, said):
    """A torch model given as the port was found only after the torch capture."""
    process = parity_cli("run", "--torch-model", torch_model, "--ms-model", ms_model,
                         "--image-size", "16", "--out", tmp_path / "run")
    assert (process.returncode, process.stderr.strip()) == (2, f"parity: error: {said}")
    assert not (tmp_path / "run").exists()


def test_check_refuses_a_misspelt_ms_loss_before_the_torch_capture(monkeypatch):
    """parity.check() runs in this process: it imports the loss's module for real."""
    import parity
    from parity.capture import torch_capture
    from tests import tiny

    def not_reached(*args, **kwargs):
        raise AssertionError("the torch capture ran")

    monkeypatch.setattr(torch_capture, "capture_torch", not_reached)
    with pytest.raises(ParityInputError, match="tests.losses has no callable 'nope'"):
        parity.check(tiny.torch_tiny(), tiny.ms_tiny(), image_size=16,
                     ms_loss="tests.losses:nope")
