"""parity: layer-by-layer numerical parity between PyTorch models and their MindSpore ports."""

__version__ = "0.1.0"
__all__ = ["check", "CheckResult", "ParityInputError", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import parity` stays cheap and imports no framework: the `parity`
    # command starts by importing this package, before it can handle Ctrl-C (parity.launch).
    if name == "check":
        from parity.api import check
        return check
    if name == "CheckResult":
        from parity.result import CheckResult
        return CheckResult
    if name == "ParityInputError":
        from parity.errors import ParityInputError
        return ParityInputError
    raise AttributeError(name)
