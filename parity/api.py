"""The Python API: everything the CLI and the pytest plugin do goes through here.

``run`` captures each framework in its own process (their native libraries stay apart, and the
two halves are the same commands a user runs on two machines), then compares. ``check`` does
the same for live model objects inside the calling process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from parity.capture.batch import checked_batch
from parity.compare.engine import compare_runs
from parity.compare.measure import start_helper, worth_a_helper
from parity.compare.tolerance import TolerancePolicy
from parity.config import StepConfig, other_optimizers_settings
from parity.errors import EXIT_INTERRUPTED, SMALLER_BATCH, Interrupted, ParityInputError
from parity.io import replaced_whole
from parity.models_loader import (load_factory, refuse_evidently_missing,
                                  refuse_the_other_frameworks)
from parity.processes import as_child_of_this_process, stop
from parity.result import CheckResult
from parity.rundir import (KEEP_REPLACED_ENV, MANIFEST, RUN_INDEX, RunReader, is_run_dir,
                           remove_abandoned_partials, remove_replaced, stored_bytes)

# What a capture subprocess needs in its environment: quiet MindSpore logging.
CHILD_ENV = {"GLOG_v": "3"}

Progress = Callable[[str, str], None]       # (stage, state) with state "start" or "done"


@dataclass(frozen=True)
class CaptureOptions:
    """Per-run inputs that are not part of the training-step configuration."""

    torch_factory: str
    mindspore_factory: str
    torch_weights: Optional[Path] = None
    batch_file: Optional[Path] = None
    name_map: Optional[Mapping[str, str]] = None
    fp64_reference: bool = True


def load_name_map(path: Optional[Path]) -> Dict[str, str]:
    """A --map file: MindSpore name -> PyTorch name, as TOML (a flat table) or JSON."""
    if path is None:
        return {}
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import tomllib
            data = tomllib.loads(text)
    except FileNotFoundError:
        raise ParityInputError(f"--map file {path} does not exist") from None
    except (OSError, ValueError) as error:
        raise ParityInputError(f"--map file {path} is not valid TOML/JSON ({error})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in data.items()):
        raise ParityInputError(f"--map file {path} must map MindSpore names to PyTorch names "
                               "(\"ms.name\" = \"torch.name\")")
    return dict(data)


def _prepare_run_dir(out: Path, config: StepConfig, command: str) -> None:
    """Create (or reuse) the directory holding torch/ and mindspore/, marked as parity's."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())
                         and not (out / RUN_INDEX).exists()):
        raise ParityInputError(f"--out {out} exists and is not a parity run directory; "
                               "choose another or remove it")
    out.mkdir(parents=True, exist_ok=True)
    _write_run_index(out, config, command, finished=False)


def _write_run_index(out: Path, config: StepConfig, command: str, *, finished: bool) -> None:
    """The run's index, replaced whole. ``finished``: both captures beside it are this run's;
    a run stopped before that leaves it false, beside any captures an earlier run left."""
    with replaced_whole(out / RUN_INDEX) as partial:
        partial.write_text(json.dumps({"format": "parity-run-pair", "command": command,
                                       "config": config.to_dict(), "finished": finished},
                                      indent=1))


def capture_in_subprocess(framework: str, config: StepConfig, out: Path,
                          options: CaptureOptions, *, reference: Optional[Path] = None,
                          map_file: Optional[Path] = None, debug: bool = False,
                          keep_replaced: bool = False) -> Path:
    """``parity capture`` in a fresh interpreter; its one-line error becomes ours. With
    ``keep_replaced`` a run it replaces is left for ``rundir.remove_replaced``."""
    command = [sys.executable, "-m", "parity", "capture", "--framework", framework,
               "--out", str(out), "--config-json", json.dumps(config.to_dict()),
               "--torch-model", options.torch_factory, "--ms-model", options.mindspore_factory]
    if reference is not None:
        command += ["--reference", str(reference)]
    if framework == "torch" and options.torch_weights is not None:
        command += ["--weights", str(options.torch_weights)]
    if options.batch_file is not None:
        command += ["--input", str(options.batch_file)]
    if map_file is not None:
        command += ["--map", str(map_file)]
    if not options.fp64_reference:
        command.append("--no-fp64-reference")
    if debug:
        command.append("--debug")
    env = {**os.environ, **CHILD_ENV, **as_child_of_this_process(),
           **({KEEP_REPLACED_ENV: "1"} if keep_replaced else {})}
    returncode, stderr = _run_capture(command, env, out)
    if returncode == 0:
        return out
    if returncode == -signal.SIGINT or returncode in EXIT_INTERRUPTED:  # it cleaned up
        raise KeyboardInterrupt
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if debug:       # its traceback
        print("\n".join(lines), file=sys.stderr)
    message = next((line for line in reversed(lines) if line.startswith("parity: error:")), None)
    if message:
        raise ParityInputError(f"{framework} capture: {message.removeprefix('parity: error: ')}")
    if returncode < 0:
        raise ParityInputError(f"the {framework} capture was {_killed_by(-returncode)}")
    last = lines[-1] if lines else "no output"
    raise ParityInputError(f"the {framework} capture failed (exit {returncode}): {last}; "
                           "rerun with --debug for its full output")


def _run_capture(command: List[str], env: Dict[str, str], out: Path) -> Tuple[int, str]:
    """Run a capture process to its end: (exit code, its stderr).

    It runs in a session of its own, so that a Ctrl-C reaches it once, from here, whether a
    terminal sent it or ``kill -INT`` sent it to parity alone; parity then waits while the
    capture removes its partial directory (``subprocess.run`` killed it after 0.25 s), and kills
    it only after processes.CLEAN_UP_SECONDS or at a second Ctrl-C. The partial directory of a
    capture that could not remove it (killed: by the kernel when memory ran out, or from here)
    is removed here.
    """
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        try:
            _, stderr = process.communicate()
        except KeyboardInterrupt:
            stop(process, signal.SIGINT)
            raise
    finally:
        if process.returncode != 0:
            remove_abandoned_partials(out)
    return process.returncode, stderr


def _killed_by(number: int) -> str:
    """How a capture process that a signal ended died, and what to do."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGKILL:
        return (f"killed ({name}), on Linux most often by the kernel when memory runs out "
                f"(dmesg says): {SMALLER_BATCH}")
    return f"ended by {name}; rerun with --debug for its full output"


def run(config: StepConfig, out: Path, options: CaptureOptions, *,
        policy: Optional[TolerancePolicy] = None, map_file: Optional[Path] = None,
        command: str = "", progress: Optional[Progress] = None,
        debug: bool = False) -> CheckResult:
    """Capture torch then MindSpore (each in its own process) into ``out``, then compare."""
    out = Path(out)
    refuse_the_other_frameworks(options.torch_factory, "torch")
    refuse_the_other_frameworks(options.mindspore_factory, "mindspore")
    for spec in (options.mindspore_factory, config.ms_loss):    # before minutes of torch
        if spec is not None:
            refuse_evidently_missing(spec)
    created = not out.exists()
    _prepare_run_dir(out, config, command)
    report = progress or (lambda stage, state: None)
    torch_dir, ms_dir = out / "torch", out / "mindspore"
    report("torch capture", "start")
    try:
        capture_in_subprocess("torch", config, torch_dir, options, map_file=map_file,
                              debug=debug)      # which checks the map's PyTorch names
    except BaseException:           # Ctrl-C too: a directory holding only our marker goes
        if created and [path.name for path in out.iterdir()] == [RUN_INDEX]:
            shutil.rmtree(out, ignore_errors=True)
        raise
    report("torch capture", "done")
    # compare's helper starts now, so that its start-up (an interpreter, numpy, parity's
    # readers: 0.3 s and more) is over when the compare begins; idle, it holds 38 MB. The
    # MindSpore run will store about as many bytes as torch's.
    helper = start_helper() if worth_a_helper(2 * stored_bytes(torch_dir)) else None
    try:
        report("mindspore capture", "start")
        try:
            # the run it replaces is deleted after the compare: the file system's work for its
            # gigabytes would slow the compare (the torch capture's, 20 s earlier, is done by
            # then)
            capture_in_subprocess("mindspore", config, ms_dir, options, reference=torch_dir,
                                  map_file=map_file, debug=debug, keep_replaced=True)
        except ParityInputError as error:
            raise ParityInputError(f"{error}; {_torch_capture_kept(torch_dir)}") from None
        except KeyboardInterrupt:
            raise Interrupted(_torch_capture_kept(torch_dir)) from None
        _write_run_index(out, config, command, finished=True)
        report("mindspore capture", "done")
        report("compare", "start")
        try:
            result = compare_runs(torch_dir, ms_dir, policy=policy,
                                  forward_overrides=options.name_map, command=command,
                                  helper=helper)
        except KeyboardInterrupt:
            raise Interrupted(captures_kept(out)) from None
        finally:
            remove_replaced(ms_dir)
    finally:
        if helper is not None:
            helper.close()
    report("compare", "done")
    return result


def _torch_capture_kept(torch_dir: Path) -> str:
    return (f"the torch capture is kept in {torch_dir} ('parity capture --framework mindspore "
            f"--reference {torch_dir}' reruns MindSpore alone, with this run's options)")


def captures_kept(out: Path) -> str:
    """What a run interrupted once both captures are whole keeps, and how to finish it."""
    return (f"both captures are kept in {out} ('parity compare {out / 'torch'} "
            f"{out / 'mindspore'}' compares them)")


def _with_betas_split(options: Dict[str, Any]) -> Dict[str, Any]:
    """torch's ``betas=(b1, b2)`` as the settings beta1 and beta2."""
    if "betas" not in options:
        return options
    betas = options.pop("betas")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ParityInputError(f"betas in optimizer is a pair (beta1, beta2), as torch's; got "
                               f"{betas!r}")
    if {"beta1", "beta2"} & set(options):
        raise ParityInputError("betas and beta1 or beta2 in optimizer: pass one or the other")
    return {**options, "beta1": betas[0], "beta2": betas[1]}


def check(torch_model: Any, ms_model: Any, *, batch_size: Optional[int] = None,
          image_size: Optional[int] = None,
          seed: int = 0, inputs: Optional[Tuple[Any, np.ndarray]] = None,
          optimizer: Optional[Mapping[str, Any]] = None,
          torch_loss: Optional[str] = None, ms_loss: Optional[str] = None,
          tolerance: Union[None, TolerancePolicy, str, Path, Mapping[str, Any]] = None,
          name_map: Optional[Mapping[str, str]] = None, out: Optional[Path] = None,
          fp64_reference: bool = True) -> CheckResult:
    """Check a live torch model against a live MindSpore model, one training step each.

    The torch model's current weights are copied into the MindSpore model (validated transfer)
    first. ``inputs`` is an optional ``(x, y)`` batch (float32 N×C×H×W or integer token ids,
    integer labels; ``x`` a tuple of arrays for a model taking several inputs); without it a
    seeded synthetic batch of ``batch_size`` × 3 × ``image_size``² is used (default 2 × 3 ×
    224²; with ``inputs`` the two sizes are refused, not ignored).
    ``optimizer`` overrides StepConfig fields (optimizer "sgd", "adam" or "adamw", lr,
    weight_decay; SGD's momentum, nesterov, dampening; Adam's betas (or beta1, beta2), eps
    ...).
    ``torch_loss`` / ``ms_loss`` are "package.module:factory" paths of your losses, as the
    command line's --torch-loss / --ms-loss (default: mean cross entropy).
    Captures go to ``out`` (a temporary directory when None, deleted afterwards).
    """
    if inputs is not None and (batch_size, image_size) != (None, None):
        raise ParityInputError("check()'s batch_size and image_size shape the synthetic batch; "
                               "with inputs= the batch is yours: leave them out")
    import mindspore  # noqa: F401  (before torch; see DESIGN.md)

    from parity.capture.mindspore_capture import capture_mindspore, refuse_map_names_not_in_port
    from parity.capture.torch_capture import capture_torch, refuse_map_names_not_in_model

    _refuse_wrong_models(torch_model, ms_model)
    refuse_map_names_not_in_model(torch_model, name_map or {})
    refuse_map_names_not_in_port(ms_model, name_map or {})
    synthetic = inputs is None
    own = dict(batch_size=2 if synthetic and batch_size is None else batch_size,
               image_size=224 if synthetic and image_size is None else image_size, seed=seed,
               torch_loss=torch_loss, ms_loss=ms_loss)
    options = _with_betas_split(dict(optimizer or {}))
    unknown = set(options) - set(StepConfig.__dataclass_fields__)
    if unknown:
        raise ParityInputError(f"unknown optimizer option(s) {', '.join(sorted(unknown))}")
    twice = sorted(set(options) & set(own))
    if twice:
        raise ParityInputError(f"{', '.join(twice)} in optimizer: pass them as check()'s own "
                               "keyword arguments")
    try:
        config = StepConfig(**own, **options)
    except ValueError as error:
        raise ParityInputError(str(error)) from None
    problem = other_optimizers_settings(config.optimizer, {key: key for key in options},
                                        "optimizer ")
    if problem:
        raise ParityInputError(problem)
    if config.ms_loss is not None:
        load_factory(config.ms_loss)        # a misspelt one refused before the torch capture
    policy = as_policy(tolerance)
    batch = None
    if inputs is not None:
        if not isinstance(inputs, (tuple, list)) or len(inputs) != 2:
            raise ParityInputError("check()'s inputs= is a pair (x, y): the model's input (a "
                                   "tuple of arrays for a model taking several) and its integer "
                                   "labels")
        x, y = inputs
        batch = checked_batch([np.asarray(v) for v in (x if isinstance(x, tuple) else (x,))],
                              np.asarray(y), "check()'s inputs=")
    with tempfile.TemporaryDirectory(prefix="parity-") as scratch:
        root = Path(out) if out is not None else Path(scratch)
        _prepare_run_dir(root, config, "parity.check(...)")
        with _callers_settings_kept():
            torch_dir = capture_torch(config, root / "torch", model=torch_model, batch=batch,
                                      fp64_reference=fp64_reference)
            ms_dir = capture_mindspore(config, root / "mindspore", model=ms_model,
                                       reference=torch_dir, overrides=name_map)
        _write_run_index(root, config, "parity.check(...)", finished=True)
        return compare_runs(torch_dir, ms_dir, policy=policy, forward_overrides=name_map,
                            command="parity.check(...)")


def _refuse_wrong_models(torch_model: Any, ms_model: Any) -> None:
    """check(torch_model, ms_model): each of its framework, and in that order."""
    import torch
    from mindspore import nn
    if isinstance(torch_model, nn.Cell) and isinstance(ms_model, torch.nn.Module):
        raise ParityInputError("check() got the MindSpore model first: pass the torch model "
                               "first, check(torch_model, ms_model)")
    for model, expected, what in ((torch_model, torch.nn.Module, "torch_model"),
                                  (ms_model, nn.Cell, "ms_model")):
        if not isinstance(model, expected):
            raise ParityInputError(f"check()'s {what} is a {type(model).__name__}, not a "
                                   f"{expected.__module__.split('.')[0]}.nn."
                                   f"{expected.__name__}")


@contextmanager
def _callers_settings_kept() -> Iterator[None]:
    """``check`` captures in the caller's process, often a test suite: the process-wide
    settings the captures change are put back afterwards (torch's and numpy's global random
    generators, torch's deterministic-algorithms mode, MindSpore's execution mode), so the
    caller's later numbers do not depend on having called it. The settings a capture changes
    only while it steps (numpy's BLAS threads, MindSpore's pynative_synchronize) it puts back
    itself. MindSpore's global seed (and the dataset seed it sets), which has no public way back
    to unset, stays at the check's seed."""
    import mindspore as ms
    import torch
    mode = ms.get_context("mode")
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    numpy_state = np.random.get_state()
    # CUDA's generators only where CUDA is already up: reading them would start it
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
            np.random.set_state(numpy_state)
            ms.set_context(mode=mode)


def load_result(source: Path, policy: Optional[TolerancePolicy] = None) -> CheckResult:
    """A CheckResult from a JSON report, or by comparing the captures in a run directory."""
    source = Path(source)
    if source.is_file():
        return CheckResult.from_json(source)
    if (source / "torch").is_dir() and (source / "mindspore").is_dir():
        result = compare_runs(source / "torch", source / "mindspore", policy=policy)
        if _run_index(source).get("finished") is False:
            note = (f"the last parity run into {source} did not finish (stopped or killed): "
                    "the captures here may be an earlier run's")
            result = replace(result, meta=replace(result.meta, notes=(note, *result.meta.notes)))
        return result
    if not source.exists():
        raise ParityInputError(f"{source} does not exist: pass a run directory ('parity run "
                               "--out') or a JSON report ('--json')")
    if (source / MANIFEST).is_file():
        RunReader.open(source)      # a damaged capture is told what is wrong with it
        whole = all(is_run_dir(source.parent / side) for side in ("torch", "mindspore"))
        raise ParityInputError(
            f"{source} is one capture, not a whole run: " +
            (f"'parity report {source.parent}' reports the run holding it" if whole else
             "'parity compare TORCH_CAPTURE MINDSPORE_CAPTURE' compares it with the other "
             "side's"))
    raise ParityInputError(f"{source} is neither a JSON report nor a run directory holding "
                           "torch/ and mindspore/")


def _run_index(run: Path) -> Dict[str, Any]:
    """The index ``parity run`` keeps in ``run``; empty if there is none (or it is damaged)."""
    try:
        index = json.loads((run / RUN_INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def as_policy(tolerance: Union[None, TolerancePolicy, str, Path, Mapping[str, Any]]
              ) -> TolerancePolicy:
    if tolerance is None:
        return TolerancePolicy()
    if isinstance(tolerance, TolerancePolicy):
        return tolerance
    if isinstance(tolerance, (str, Path)):
        return TolerancePolicy.from_toml(Path(tolerance))
    return TolerancePolicy.from_mapping(dict(tolerance))
