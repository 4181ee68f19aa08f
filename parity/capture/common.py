"""What the torch and MindSpore captures share besides hooks and batch: the model-output
and update conventions, the starting point's fingerprint, versions, phase timing, manifest."""

from __future__ import annotations

import os
import platform
import re
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, Optional, Set

import numpy as np
from threadpoolctl import threadpool_limits

from parity.errors import (SMALLER_BATCH, ParityInputError, UserCodeFailed, first_few,
                           in_one_line, memory_ran_out)
from parity.records import split_part
from parity.resources import peak_resident_mb
from parity.rundir import crc32


@contextmanager
def failure_explained(framework: str, failed: str, advice: str,
                      memory_advice: str = SMALLER_BATCH) -> Iterator[None]:
    """The framework's error of the user's model, with what most likely caused it and the way
    round it (``memory_advice`` when memory ran out): one line, as every input error (a
    framework's message can run to a C++ stack: its first line is kept, --debug shows the
    rest)."""
    try:
        yield
    except ParityInputError:
        raise
    except Exception as error:
        what = in_one_line(error)
        ran_out = memory_ran_out(error)
        if ran_out:
            raise ParityInputError(f"the {framework} step {ran_out} {failed}: {what}; "
                                   f"{memory_advice}") from error
        if NO_KERNEL.search(what):
            advice = NO_KERNEL_ADVICE
        raise UserCodeFailed(f"the {framework} model failed {failed}: {what}. {advice}") \
            from error


# How MindSpore says its device has no kernel for an op, measured on MindSpore 2.8.0's CPU:
# mindspore.mint.nn's Conv2d ("The kernel Conv2DExt unregistered."), BatchNorm2d, GELU,
# AdaptiveAvgPool2d, Embedding; its LayerNorm ("Create kernelmod for op LayerNormExt failed"),
# MaxPool2d ("Not found op ... FuncMaxPool2D on device"); nn.InstanceNorm2d ("Unsupported op").
NO_KERNEL = re.compile(r"The kernel \S+ unregistered|Create kernelmod for op|Not found op \S+ on "
                       r"device|Unsupported op")
NO_KERNEL_ADVICE = ("This MindSpore has no kernel for that op on this device: on CPU, "
                    "mindspore.mint.nn's Conv2d, BatchNorm2d, LayerNorm, GELU, pooling and "
                    "Embedding have none (MindSpore 2.8.0), nor nn.InstanceNorm2d; write those "
                    "layers with mindspore.nn for the check, or run it where the kernel exists")


def refuse_map_names_not_in(names: Iterable[str], known: Set[str], what: str) -> None:
    """--map names (a MindSpore name = a PyTorch name a line) that are no ``what`` of the model
    they name pin nothing: a typo, or the two sides written the wrong way round. A name may
    end in "#k", the k-th call of a module called more than once, or name rows of a parameter
    (``qkv.weight[0:32]``, records.split_part: a layer one side holds apart)."""
    unknown = [name for name in names if split_part(name.partition("#")[0])[0] not in known]
    if unknown:
        are = "is" if len(unknown) == 1 else "are"
        raise ParityInputError(f"--map: {first_few(unknown)} {are} no {what}; each line maps a "
                               "MindSpore name to a PyTorch one (\"mindspore.name\" = "
                               "\"torch.name\")")


def several_outputs(outputs: Any) -> str:
    """'a tuple of 2 outputs' (or list; "a dict ('logits', 'aux')", saying how to take the
    logits from it) when a model returned a container, else '': such a model has no one logits
    tensor for the default loss or the class count."""
    if isinstance(outputs, dict):
        logits = " (as Hugging Face models return: to train on its logits alone, wrap the " \
            "model in a module returning model(...).logits)" if "logits" in outputs else ""
        return f"a dict ({', '.join(repr(key) for key in outputs)}){logits}"
    if isinstance(outputs, (tuple, list)):
        return f"a {type(outputs).__name__} of {len(outputs)} " \
            f"output{'' if len(outputs) == 1 else 's'}"
    return ""


def refuse_several_outputs(outputs: Any, framework: str) -> None:
    """The default loss is cross entropy of one logits tensor: a model with several outputs
    (an auxiliary head, say) is told to pass the loss its training script uses."""
    several = several_outputs(outputs)
    if several:
        raise ParityInputError(
            f"the {framework} model returns {several}; parity's default loss (mean cross "
            "entropy) takes one logits tensor: pass --torch-loss and --ms-loss (parity.check: "
            "torch_loss=, ms_loss=) factories of the losses that take them")


def weight_update(after: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Δw = after - before in the weights' dtype: comparing w1 alone hides small update bugs.

    IEEE subtraction rounds the exact difference once: exact wherever w and w1 are within a
    factor of 2 of each other (Sterbenz's lemma: nearly every element), elsewhere off by at
    most half an ulp of Δw (2**-24 relative in float32) — under a tenth of the noise floor
    (1e-6 · rms) the verdict adds anyway. Keeping float64 wherever one element needed it made
    the Δw of nearly every large conv float64: 204 of 527 MB of a ResNet50 run at 2×64².
    """
    return after - before


def fingerprint(*blobs: Any) -> str:
    """CRC-32 of what a run starts from (initial-weight bytes, batch arrays): two runs with
    equal fingerprints checked the same numbers, so their errors may be compared (baselines)."""
    crc = 0
    for blob in blobs:
        crc = crc32(np.ascontiguousarray(blob) if isinstance(blob, np.ndarray) else blob, crc)
    return f"{crc:08x}"


def numpy_on_one_thread() -> threadpool_limits:
    """numpy's BLAS on one thread while the steps run (a context manager).

    The hooks' numpy work (input sketches, the float64 step's noise) is a few small BLAS
    calls between the framework's ops; numpy's OpenBLAS threads then spin idle on the cores
    torch's and MindSpore's own threads need. Measured (ResNet50, batch 8, 224², the hooks
    with records discarded, two runs each): torch hooked step 5.00-5.13 s → 4.43-4.47 s
    (3.9-4.2 s with no hooks); the float64 step's, median of 5 torch captures, 21.3 → 19.2 s.
    Both captures set it, so the sketches of equal inputs are computed alike.
    """
    return threadpool_limits(limits=1, user_api="blas")


def _platform() -> str:
    """platform.platform()'s text without the processor name, which it reads by running
    `uname -p`: a process started at the capture's memory peak."""
    system = os.uname()
    libc = "".join(platform.libc_ver())
    return f"{system.sysname}-{system.release}-{system.machine}" + (f"-with-{libc}" if libc else "")


def framework_versions(framework: str) -> Dict[str, str]:
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "platform": _platform()}
    if framework == "torch":
        import torch
        import torchvision
        versions.update(torch=torch.__version__, torchvision=torchvision.__version__)
    else:
        import mindspore
        versions.update(mindspore=mindspore.__version__,
                        device=str(mindspore.get_context("device_target")))
    return versions


class PhaseClock:
    """Where a capture's time and memory go: ``clock.next("hooked step")`` ends the phase
    running and starts the named one. The clock starts after the model factory's imports, as
    the bench's bare steps do; each phase's seconds land in the manifest
    (``resources.phases``), and so does the process's peak memory as each phase ended
    (``resources.peak_rss_mb_after``): the cost of every check parity adds is measured, not
    guessed."""

    def __init__(self, first: str) -> None:
        self.phases: Dict[str, float] = {}
        self.peaks_after: Dict[str, float] = {}
        self.started = self._mark = time.perf_counter()
        self._current = first

    def next(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[self._current] = self.phases.get(self._current, 0.0) + now - self._mark
        self.peaks_after[self._current] = peak_resident_mb()
        self._current, self._mark = phase, now

    def usage(self) -> Dict[str, Any]:
        """Seconds so far (the phase running included), by phase, and peak resident memory,
        also as it stood at the end of each phase."""
        self.next(self._current)
        return {"seconds": self._mark - self.started,
                "phases": {name: round(seconds, 3) for name, seconds in self.phases.items()},
                "peak_rss_mb": peak_resident_mb(), "peak_rss_mb_after": dict(self.peaks_after)}


def manifest_meta(framework: str, config, num_classes: Optional[int], factory: str,
                  param_map: Dict[str, str], observer: Dict[str, Any], clock: PhaseClock,
                  **extra: Any) -> Dict[str, Any]:
    """What a capture's manifest says about the run besides its records."""
    return {"versions": framework_versions(framework), "seed": config.seed,
            "config": {**config.to_dict(), "num_classes": num_classes}, "factory": factory,
            "param_map": param_map, "self_checks": {"observer_effect": observer},
            "resources": clock.usage(), **extra}
