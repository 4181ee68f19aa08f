"""parity: layer-by-layer numerical parity between PyTorch models and their MindSpore ports."""

from parity.errors import ParityInputError

__version__ = "0.1.0"
__all__ = ["check", "CheckResult", "ParityInputError", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import parity` stays cheap and imports no framework.
    if name == "check":
        from parity.api import check
        return check
    if name == "CheckResult":
        from parity.result import CheckResult
        return CheckResult
    raise AttributeError(name)
