"""The ``parity`` command: a thin layer of argument groups over parity.api.

Exit codes (parity.errors): 0 parity, 1 violations, 2 bad input or usage, 130 interrupted,
143 terminated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, NoReturn, Optional

os.environ.setdefault("GLOG_v", "3")     # MindSpore's C++ logging, before it is imported

from parity import __version__  # noqa: E402
from parity.config import (ADAM_SETTINGS, INTEGER_SETTINGS, MS_ADAMS,  # noqa: E402
                           OPTIMIZERS, SGD_SETTINGS, SHARED_STEP_SETTINGS, WEIGHT_DECAY_SCOPES,
                           StepConfig, other_optimizers_settings, out_of_range)
from parity.errors import (EXIT_FAIL, EXIT_INPUT, EXIT_PASS,  # noqa: E402
                           INTERRUPT_NAMES, TRACEBACK_HINT, Interrupted,
                           ParityInputError, UserCodeFailed,
                           file_system_refusal, first_few, in_one_line,
                           interrupted_exit)
from parity.io import (BASELINE, CSV_REPORT, HTML_REPORT, JSON_REPORT,  # noqa: E402
                       refuse_unwritable, replaced_whole, same_file)
from parity.launch import interrupted_while_loading  # noqa: E402
from parity.processes import end_with_parent  # noqa: E402

REPORTS = Path("reports")
# What --torch-weights (--weights) reads: weights.load_state_dict.
TORCH_WEIGHTS = ("a torch state dict (.pth/.pt/.bin, read without running pickled code, or "
                 ".safetensors), or a training checkpoint holding one (a Lightning .ckpt too)")


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2, pointing to the help of
    the (sub)command they concern. Each (sub)command takes --debug, wherever it is put: the
    error lines say "rerun with --debug"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show tracebacks")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ParityInputError(f"{message} (see '{self.prog} --help')")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extra = super().parse_known_args(args, namespace)
        if not hasattr(parsed, "_command_prog"):      # the innermost subcommand parses first
            parsed._command_prog = self.prog
        return parsed, extra

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:   # argparse would blame the top-level command for a subcommand's option
            raise ParityInputError(f"unrecognized arguments: {' '.join(extra)} "
                                   f"(see '{parsed._command_prog} --help')")
        return parsed


def _number(setting: str) -> Callable[[str], float]:
    """The argparse type of a numeric setting: a number in config.NUMBER_RANGES[setting], an
    integer for config.INTEGER_SETTINGS."""
    def parse(text: str) -> float:
        try:
            value = int(text) if setting in INTEGER_SETTINGS else float(text)
        except ValueError:
            value = None
        problem = out_of_range(setting, value)
        if problem:
            raise argparse.ArgumentTypeError(f"{problem}, got {text}")
        return value
    return parse


BUILT_IN = "resnet18/34/50/101/152, mobilenet_v2 (default resnet50)"
MS_MODEL_HELP = "zero-argument callable returning your mindspore.nn.Cell"
MAP_HELP = "TOML/JSON table of MindSpore name = PyTorch name overrides"
RUN_OR_REPORT_HELP = ("a run directory (holding torch/ and mindspore/) or a JSON report "
                      "(--json)")


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model pair")
    group.add_argument("--model", default="resnet50", help=f"built-in pair: {BUILT_IN}")
    group.add_argument("--torch-model", metavar="PKG.MOD:FACTORY",
                       help="zero-argument callable returning your torch.nn.Module")
    group.add_argument("--ms-model", metavar="PKG.MOD:FACTORY", help=MS_MODEL_HELP)
    group.add_argument("--map", type=Path, metavar="FILE", help=MAP_HELP)


def _add_step_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training step")
    # Default None, as the shared step settings below: given where the batch is not parity's
    # synthetic one they are refused (step_config), not ignored.
    group.add_argument("--batch-size", type=_number("batch_size"),
                       help="samples in the synthetic batch (default 2)")
    group.add_argument("--image-size", type=_number("image_size"),
                       help="square side of the synthetic batch's images (default 64; ResNet "
                            "works at that size)")
    group.add_argument("--seed", type=_number("seed"),
                       help="seeds the initial weights and the synthetic batch (default 0); "
                            "another seed checks other ReLU units and roundings")
    group.add_argument("--num-classes", type=_number("num_classes"),
                       help="class count for synthetic labels (default: the model's own)")
    group.add_argument("--input", type=Path, metavar="FILE.npz",
                       help="your batch: arrays x (floats such as N×C×H×W images, or integer token "
                            "ids), x1, x2... for a model taking more inputs (an attention mask), "
                            "and y (class indices: per sample, or per pixel or token)")
    # The shared step settings default to None here: a MindSpore capture fills what was not
    # given from its --reference, anything else from StepConfig's defaults (step_config).
    group.add_argument("--optimizer", choices=OPTIMIZERS,
                       help="torch.optim's SGD, Adam or AdamW, both sides (default sgd; "
                            "MindSpore's side steps as torch's does)")
    group.add_argument("--lr", type=_number("lr"),
                       help="learning rate, both sides (default 0.1)")
    group.add_argument("--momentum", type=_number("momentum"), help="SGD momentum (default 0.9)")
    group.add_argument("--weight-decay", type=_number("weight_decay"),
                       help="weight decay (default 1e-4; Adam's is added to the gradient, "
                            "AdamW's decoupled; its MindSpore scope: --ms-weight-decay-scope)")
    group.add_argument("--nesterov", action=argparse.BooleanOptionalAction,
                       help="Nesterov momentum (default off)")
    group.add_argument("--dampening", type=_number("dampening"),
                       help="torch SGD dampening (default 0; no effect on the first step's "
                            "buffer)")
    group.add_argument("--betas", type=_number("beta1"), nargs=2, metavar=("B1", "B2"),
                       help="Adam's and AdamW's betas (default 0.9 0.999)")
    group.add_argument("--eps", type=_number("eps"),
                       help="Adam's and AdamW's eps (default 1e-8)")
    group.add_argument("--label-smoothing", type=_number("label_smoothing"),
                       help="of the default loss, mean cross entropy (default 0)")
    group.add_argument("--torch-loss", metavar="PKG.MOD:FACTORY",
                       help="zero-argument callable returning your torch loss, called as "
                            "loss(outputs, labels) (default: mean cross entropy)")
    group.add_argument("--ms-loss", metavar="PKG.MOD:FACTORY",
                       help="zero-argument callable returning your MindSpore loss, called as "
                            "loss(outputs, labels) with int32 labels")
    group.add_argument("--ms-weight-decay-scope", choices=WEIGHT_DECAY_SCOPES, default="all",
                       help="which MindSpore parameters get weight decay; torch decays all. "
                            "MindSpore's own default skips gamma/beta")
    group.add_argument("--ms-adam", choices=MS_ADAMS,
                       help="step MindSpore's side of --optimizer adam/adamw with this "
                            "optimizer, as your training script does (default: "
                            "experimental.optim.AdamW, which matches torch's)")
    group.add_argument("--ms-loss-scale", type=_number("ms_loss_scale"), default=1.0,
                       help="MindSpore optimizer loss_scale")
    group.add_argument("--ms-no-scale-loss", action="store_true",
                       help="do not multiply the MindSpore loss by --ms-loss-scale "
                            "(reproduces the 'loss_scale without scaling the loss' bug)")
    group.add_argument("--no-fp64-reference", action="store_true",
                       help="skip torch's float64 rerun; verdicts then use fixed tolerances")
    group.add_argument("--config-json", help=argparse.SUPPRESS)


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reports")
    group.add_argument("--json", type=Path, metavar="PATH", help="machine-readable report")
    group.add_argument("--csv", type=Path, metavar="PATH", help="one row per record")
    group.add_argument("--html", type=Path, metavar="PATH", help="self-contained HTML report")
    group.add_argument("--tolerance", type=Path, metavar="FILE.toml",
                       help="tolerance overrides per kind and per name pattern")
    group.add_argument("--quiet", action="store_true", help="print only the verdict line")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="parity", description=(
        "Layer-by-layer numerical parity between a PyTorch model and its MindSpore port: "
        "one training step in each, every activation, gradient, update and buffer compared."))
    parser.set_defaults(debug=False)
    parser.add_argument("--version", action="version", version=f"parity {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)

    run = sub.add_parser("run", help="capture both frameworks, compare, report",
                         description="Capture torch and MindSpore (each in its own process), "
                                     "compare and report. No arguments: ResNet50, seeded "
                                     "batch 2×3×64×64.")
    _add_model_options(run)
    _add_step_options(run)
    run.add_argument("--torch-weights", type=Path, metavar="FILE",
                     help=f"start from these weights: {TORCH_WEIGHTS}")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="run directory (default reports/runs/MODEL)")
    _add_report_options(run)
    run.add_argument("--progress", choices=("auto", "plain", "none"), default="auto",
                     help="auto: a spinner per stage where stderr is a terminal, nothing "
                          "otherwise; plain: a line on stderr as each stage starts and ends, "
                          "with its seconds (CI logs); none: nothing (default auto; --quiet "
                          "turns auto off)")

    capture = sub.add_parser("capture", help="one framework's half of a run",
                             description="Run the training step in one framework and write a "
                                         "run directory. Capture torch first: the MindSpore "
                                         "side then takes from it (--reference) its weights, "
                                         "its batch, seed and class count, and each step "
                                         "setting not given here (--optimizer, --lr, "
                                         "--momentum, --weight-decay, --nesterov, "
                                         "--dampening, --betas, --eps, --label-smoothing).")
    capture.add_argument("--framework", choices=("torch", "mindspore"), required=True,
                         help="which side to capture")
    capture.add_argument("--out", type=Path, required=True, metavar="DIR",
                         help="run directory to write (an earlier parity capture there is "
                              "replaced, anything else refused)")
    capture.add_argument("--reference", type=Path, metavar="TORCH_RUN",
                         help="(mindspore) the torch capture to take weights, batch and step "
                              "settings from")
    capture.add_argument("--weights", type=Path, metavar="FILE",
                         help=f"start from these weights: {TORCH_WEIGHTS}")
    _add_model_options(capture)
    _add_step_options(capture)

    compare = sub.add_parser("compare", help="compare a torch and a MindSpore capture",
                             description="Compare two run directories; needs neither torch "
                                         "nor mindspore.")
    compare.add_argument("run_a", type=Path, metavar="RUN_A",
                         help="one capture directory ('parity capture --out'; a run's torch/ "
                              "or mindspore/)")
    compare.add_argument("run_b", type=Path, metavar="RUN_B",
                         help="the other framework's capture (either order)")
    compare.add_argument("--map", type=Path, metavar="FILE",
                         help="MindSpore name = PyTorch name overrides")
    _add_report_options(compare)

    report = sub.add_parser("report", help="render a run directory or JSON report",
                            description="Re-render reports from a run directory (holding "
                                        "torch/ and mindspore/) or a JSON report: the summary, "
                                        "and each file asked for (none: the summary alone).")
    report.add_argument("source", type=Path, metavar="RUN_DIR_OR_JSON",
                        help=RUN_OR_REPORT_HELP)
    _add_report_options(report)

    convert = sub.add_parser("convert-weights", help="torch weights -> MindSpore checkpoint",
                             description="Transfer a torch state dict into the MindSpore port "
                                         "(validated) and save it as .ckpt or .safetensors.")
    convert.add_argument("--model", default="resnet50", help=f"built-in port to fill: {BUILT_IN}")
    convert.add_argument("--ms-model", metavar="PKG.MOD:FACTORY",
                         help=f"{MS_MODEL_HELP} (instead of --model)")
    convert.add_argument("--num-classes", type=_number("num_classes"),
                         help="the port's class count (default: its own)")
    convert.add_argument("--torch-weights", type=Path, required=True, metavar="FILE",
                         help=f"the weights to convert: {TORCH_WEIGHTS}")
    convert.add_argument("--out", type=Path, required=True, metavar="FILE.ckpt",
                         help="checkpoint to write (.ckpt or .safetensors); an existing file "
                              "is never overwritten")
    convert.add_argument("--map", type=Path, metavar="FILE", help=MAP_HELP)

    baseline = sub.add_parser("baseline", help="save or check a golden error baseline")
    baseline_sub = baseline.add_subparsers(dest="baseline_command", metavar="ACTION",
                                           parser_class=ArgumentParser)
    save = baseline_sub.add_parser("save", help="store a known-good run's per-record errors")
    save.add_argument("run", type=Path, metavar="RUN_DIR_OR_JSON",
                      help=f"{RUN_OR_REPORT_HELP}, of a run known to be good")
    save.add_argument("--out", type=Path, required=True, metavar="FILE.json",
                      help="baseline file to write")
    check = baseline_sub.add_parser("check", help="fail when errors grew beyond the baseline")
    check.add_argument("run", type=Path, metavar="RUN_DIR_OR_JSON",
                       help=f"{RUN_OR_REPORT_HELP}, to check")
    check.add_argument("baseline", type=Path, metavar="FILE.json",
                       help="the baseline 'parity baseline save' wrote")
    check.add_argument("--factor", type=float, default=None,
                       help="allowed growth over the baseline error (default 4)")
    return parser


DEFAULT_STEP = StepConfig()
SYNTHETIC_BATCH_SETTINGS = ("batch_size", "image_size")
# the settings that drew and shaped the torch capture's starting point (its weights, the
# model's head, its batch): a MindSpore capture takes that starting point from its --reference
STARTING_POINT_SETTINGS = ("seed", "num_classes", *SYNTHETIC_BATCH_SETTINGS)
# what a MindSpore capture takes from its --reference when not given
REFERENCE_SETTINGS = SHARED_STEP_SETTINGS + STARTING_POINT_SETTINGS


def step_config(args: argparse.Namespace,
                reference: Optional[Mapping[str, Any]] = None) -> StepConfig:
    """The step the options describe. A setting both captures share that was not given comes
    from ``reference`` (the settings of the torch capture a MindSpore capture is made from),
    else from the defaults."""
    if args.config_json:
        return StepConfig.from_dict(json.loads(args.config_json))
    reference = reference or {}
    _refuse_options_without_effect(args, reference)
    shared = {key: _given(args, key) if _given(args, key) is not None
              else reference.get(key, getattr(DEFAULT_STEP, key))
              for key in REFERENCE_SETTINGS}
    if args.input:                  # no synthetic batch to shape
        shared.update(dict.fromkeys(SYNTHETIC_BATCH_SETTINGS))
    try:
        return StepConfig(
            model=args.model, torch_factory=args.torch_model, mindspore_factory=args.ms_model,
            **shared, torch_loss=args.torch_loss,
            ms_loss=args.ms_loss,
            ms_weight_decay_scope=args.ms_weight_decay_scope, ms_loss_scale=args.ms_loss_scale,
            ms_scale_loss=not args.ms_no_scale_loss, ms_adam=args.ms_adam)
    except ValueError as error:
        raise ParityInputError(str(error)) from None


def _given(args: argparse.Namespace, key: str) -> Any:
    """The value of the setting ``key`` on the command line, or None (--betas gives two)."""
    if key in ("beta1", "beta2"):
        return None if args.betas is None else args.betas[key == "beta2"]
    return getattr(args, key)


def _refuse_options_without_effect(args: argparse.Namespace,
                                   reference: Mapping[str, Any]) -> None:
    """Options that would be silently ignored: --batch-size and --image-size with the user's
    own batch; those two, --seed and --num-classes in a MindSpore capture, which takes its
    weights and batch from its --reference (its manifest recorded a seed that had drawn
    neither, and a 10-class reference was told to pass --num-classes 10); SGD's settings with
    Adam or AdamW, theirs with SGD."""
    def option(key: str) -> str:
        return "--betas" if key in ("beta1", "beta2") else f"--{key.replace('_', '-')}"
    shaping = [key for key in SYNTHETIC_BATCH_SETTINGS if getattr(args, key) is not None]
    if args.input and shaping:
        shape, them = ("shapes", "it") if len(shaping) == 1 else ("shape", "them")
        raise ParityInputError(f"{' and '.join(map(option, shaping))} {shape} parity's "
                               f"synthetic batch; with --input the batch is your file's: leave "
                               f"{them} out")
    optimizer = args.optimizer or reference.get("optimizer", DEFAULT_STEP.optimizer)
    problem = other_optimizers_settings(
        optimizer, {key: option(key) for key in (*SGD_SETTINGS, *ADAM_SETTINGS)
                    if _given(args, key) is not None}, "--optimizer ")
    if problem:
        raise ParityInputError(problem)
    given = {key: getattr(args, key) for key in STARTING_POINT_SETTINGS
             if getattr(args, key) is not None}

    def recorded(key: str) -> Any:
        if reference[key] is not None:
            return reference[key]
        return "the model's own" if key == "num_classes" else "its --input file"
    differing = [f"{option(key)} {value} (the torch capture's: {recorded(key)})"
                 for key, value in given.items() if key in reference and reference[key] != value]
    if differing:
        them = "it" if len(differing) == 1 else "them"
        raise ParityInputError(f"{', '.join(differing)}: the MindSpore capture takes its "
                               f"weights and batch from --reference; leave {them} out")


def builtin_pair(name: str):
    from models import get_pair
    try:
        return get_pair(name)
    except KeyError as error:
        raise ParityInputError(str(error.args[0])) from None


def factories(args: argparse.Namespace) -> tuple:
    if bool(args.torch_model) != bool(args.ms_model):
        raise ParityInputError("--torch-model and --ms-model go together: pass both")
    if args.torch_model:
        return args.torch_model, args.ms_model
    pair = builtin_pair(args.model)
    return pair.torch_factory, pair.mindspore_factory


def _console(stderr: bool = False):
    from rich.console import Console
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console.width = 140       # logs and CI: no terminal to size the tables to
    return console


# Each report option, and the kind of file it writes (which replaces only one of its kind).
REPORT_KINDS = {"json": JSON_REPORT, "csv": CSV_REPORT, "html": HTML_REPORT}


def _refuse_unwritable_reports(args: argparse.Namespace, reads: Optional[Path] = None) -> None:
    """Each report path asked for, checked before the captures and the compare, not after: one
    that can be written, named once, and not the report this command ``reads``."""
    asked: Dict[str, Path] = {}
    for kind, file_kind in REPORT_KINDS.items():
        if getattr(args, kind) is None:
            continue
        path = Path(getattr(args, kind))
        if reads is not None:
            _refuse_writing_over(f"--{kind}", path, reads)
        refuse_unwritable(path, replace_own=file_kind)
        twice = next((other for other, earlier in asked.items() if same_file(path, earlier)), None)
        if twice is not None:
            raise ParityInputError(f"--{twice} and --{kind} both name {path}: give each report "
                                   "a file of its own")
        asked[kind] = path


def _refuse_writing_over(option: str, path: Path, reads: Path, what: str = "") -> None:
    """Parity replaces its own files: an output over the report the command reads would lose
    it."""
    if same_file(path, reads):
        raise ParityInputError(f"{option} {path} is the report this command reads: write "
                               f"{what}to another file")


def _write_reports(result, args: argparse.Namespace, defaults: Optional[dict] = None) -> List[Path]:
    defaults = defaults or {}
    written = []
    for kind in REPORT_KINDS:
        path = getattr(args, kind) or defaults.get(kind)
        if path is not None:
            written.append(getattr(result, f"to_{kind}")(Path(path)))
    return written


def _finish(result, args: argparse.Namespace, written: List[Path]) -> int:
    from parity.report.console import summary, verdict_text
    console = _console()
    console.print(verdict_text(result) if args.quiet else summary(result))
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False)
    return EXIT_PASS if result.passed else EXIT_FAIL


def _command_line() -> str:
    """The command as typed, for the report's "reproduce" line."""
    return "parity " + shlex.join(sys.argv[1:])


def _policy(args: argparse.Namespace):
    from parity.api import as_policy
    return as_policy(args.tolerance)


@contextlib.contextmanager
def _stage_display(args: argparse.Namespace) -> Iterator[Callable[[str, str], None]]:
    """What ``parity run`` shows of its stages (torch capture, MindSpore capture, compare)."""
    console = _console(stderr=True)
    if args.progress == "plain":
        started: Dict[str, float] = {}

        def line(stage: str, state: str) -> None:
            if state == "start":
                started[stage] = time.monotonic()
                text = f"parity: {stage} ..."
            else:
                text = f"parity: {stage} done in {time.monotonic() - started[stage]:.1f} s"
            print(text, file=sys.stderr, flush=True)
        yield line
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    # a spinner only on a terminal: in a log it drew nothing but a blank line
    shown = args.progress == "auto" and not args.quiet and console.is_terminal
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True, disable=not shown) as progress:
        tasks = {}

        def spinner(stage: str, state: str) -> None:
            if state == "start":
                tasks[stage] = progress.add_task(stage, total=1)
            else:
                progress.update(tasks[stage], completed=1, description=f"{stage} ✓")
        yield spinner


def cmd_run(args: argparse.Namespace) -> int:
    from parity import api
    config = step_config(args)
    torch_factory, ms_factory = factories(args)
    name_map = api.load_name_map(args.map)
    policy = _policy(args)
    _refuse_unwritable_reports(args)
    label = args.model if not args.torch_model else "custom"
    out = args.out or REPORTS / "runs" / label
    stamp = time.strftime("%Y%m%d-%H%M%S")
    defaults = {} if any((args.json, args.csv, args.html)) else \
        {"json": REPORTS / f"{label}-{stamp}.json", "html": REPORTS / f"{label}-{stamp}.html"}
    for path in defaults.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    options = api.CaptureOptions(torch_factory=torch_factory, mindspore_factory=ms_factory,
                                 torch_weights=args.torch_weights, batch_file=args.input,
                                 name_map=name_map, fp64_reference=not args.no_fp64_reference)
    command = _command_line()
    with _stage_display(args) as report:
        result = api.run(config, out, options, policy=policy, map_file=args.map,
                         command=command, progress=report, debug=args.debug)
    try:
        return _finish(result, args, _write_reports(result, args, defaults))
    except KeyboardInterrupt:
        raise Interrupted(api.captures_kept(out)) from None


def _reference_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The step settings of the torch capture a MindSpore capture starts from (parity run
    hands its captures the whole configuration instead)."""
    if args.framework != "mindspore" or args.reference is None or args.config_json:
        return {}
    from parity.rundir import RunReader
    config = RunReader.open(args.reference).manifest.get("config", {})
    return {key: config[key] for key in REFERENCE_SETTINGS if key in config}


def cmd_capture(args: argparse.Namespace) -> int:
    from parity import api
    if args.framework == "torch" and args.reference is not None:
        raise ParityInputError("--reference is the MindSpore capture's (the torch capture it "
                               "starts from); the torch capture starts from --weights FILE or "
                               "the --seed")
    config = step_config(args, _reference_settings(args))
    torch_factory, ms_factory = factories(args)
    if args.framework == "torch":
        from parity.capture.torch_capture import capture_torch
        out = capture_torch(config, args.out, factory=torch_factory, weights=args.weights,
                            batch_file=args.input, fp64_reference=not args.no_fp64_reference,
                            own_process=True, overrides=api.load_name_map(args.map))
    else:
        from parity.capture.mindspore_capture import capture_mindspore
        from parity.weights import TransferRefused
        overrides = api.load_name_map(args.map)
        try:
            out = capture_mindspore(config, args.out, factory=ms_factory,
                                    reference=args.reference, weights=args.weights,
                                    batch_file=args.input, overrides=overrides)
        except TransferRefused as refusal:
            raise _suggested_map_written(refusal, args.reference, overrides) from None
    print(f"wrote {out}")
    return EXIT_PASS


def _suggested_map_written(refusal: Any, reference: Optional[Path],
                           overrides: Mapping[str, str]) -> ParityInputError:
    """A refused weight transfer (weights.TransferRefused), naming the file its suggested --map
    lines and the user's own are written to, for the next run to pass: the parity run
    directory holding the reference capture (``parity run``'s), where there is one."""
    from parity.rundir import RUN_INDEX, SUGGESTED_MAP
    run = Path(reference).parent if reference is not None else None
    if not refusal.suggested_map or run is None or not (run / RUN_INDEX).exists():
        return refusal
    path = run / SUGGESTED_MAP
    with replaced_whole(path) as partial:
        partial.write_text("# parity's guess at the rows one side holds stacked: check the "
                           "order, then pass this file with --map\n" +
                           "".join(f"{json.dumps(ms)} = {json.dumps(t)}\n" for ms, t in
                                   {**overrides, **refusal.suggested_map}.items()))
    return ParityInputError(f"{refusal}; the {len(refusal.suggested_map)} lines for all of "
                            f"them are written to {path}")


def cmd_compare(args: argparse.Namespace) -> int:
    from parity import api
    from parity.compare.engine import compare_runs
    _refuse_unwritable_reports(args)
    command = _command_line()
    result = compare_runs(args.run_a, args.run_b, policy=_policy(args),
                          forward_overrides=api.load_name_map(args.map), command=command)
    return _finish(result, args, _write_reports(result, args))


def cmd_report(args: argparse.Namespace) -> int:
    from parity import api
    _refuse_unwritable_reports(args, reads=Path(args.source))
    result = api.load_result(args.source, _policy(args) if args.tolerance else None)
    return _finish(result, args, _write_reports(result, args))


def cmd_convert(args: argparse.Namespace) -> int:
    import mindspore  # noqa: F401  (before torch, which .pth loading imports)

    from parity import api
    from parity.weights import convert_weights
    factory = args.ms_model or builtin_pair(args.model).mindspore_factory
    transfer, not_finite = convert_weights(factory, args.torch_weights, args.out,
                                           num_classes=args.num_classes,
                                           overrides=api.load_name_map(args.map))
    print(f"wrote {args.out}: {len(transfer.plan)} MindSpore parameters from "
          f"{args.torch_weights}")
    if transfer.left_out:
        print(f"left out {len(transfer.left_out)} torch tensor(s) no MindSpore parameter takes "
              f"(step counters, integer constants the port holds itself): "
              f"{first_few(transfer.left_out, separator=', ')}")
    if transfer.rows_left:
        print(f"left out torch's rows no MindSpore parameter takes (the port's k layer has no "
              f"bias): {first_few(transfer.rows_left, separator=', ')}")
    if transfer.port_constants:
        print(f"kept {len(transfer.port_constants)} frozen MindSpore parameter(s) no torch "
              f"tensor feeds at the port's own values (constants it computes itself): "
              f"{first_few(transfer.port_constants, separator=', ')}")
    if not_finite:
        print(f"parity: warning: {args.torch_weights} holds values that are not finite, copied "
              f"as they are ({first_few(not_finite, separator='; ')}): the port computes NaN "
              "from them; 'parity run --torch-weights' names where it starts", file=sys.stderr)
    return EXIT_PASS


def cmd_baseline(args: argparse.Namespace) -> int:
    from parity import api, baseline
    if args.baseline_command == "save":
        _refuse_writing_over("--out", Path(args.out), Path(args.run), "the baseline ")
        refuse_unwritable(Path(args.out), replace_own=BASELINE)     # before the compare
        path = baseline.save(api.load_result(args.run), args.out)
        print(f"wrote {path}")
        return EXIT_PASS
    if args.baseline_command == "check":
        drift = baseline.check(api.load_result(args.run), args.baseline, factor=args.factor)
        print(drift.message())
        return EXIT_PASS if drift.passed else EXIT_FAIL
    raise ParityInputError("baseline needs an action: save or check")


COMMANDS = {"run": cmd_run, "capture": cmd_capture, "compare": cmd_compare,
            "report": cmd_report, "convert-weights": cmd_convert, "baseline": cmd_baseline}


def main(argv: Optional[List[str]] = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    _Interrupts.install()
    _Interrupts.only_the_first = end_with_parent()    # parity run's capture, make bench's command
    code = _main(argv, debug)
    for number in _Interrupts.SIGNALS:          # the work is over: an interrupt changes nothing
        signal.signal(number, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown, whose Ctrl-C would end the process by SIGINT
    # (-2) instead of with our code: CPython restores the default handler first, and a Ctrl-C
    # that landed in an exec() (dataclasses build their methods with one) leaves its "unhandled
    # KeyboardInterrupt" flag set however the exception was handled. MindSpore 2.10 also prints
    # "Exception ignored in Cell.__del__" in the teardown. Every output is written and closed.
    os._exit(code)


def _main(argv: List[str], debug: bool) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return EXIT_INPUT
        _load_for(args)
        _Interrupts.ends_at_once = False    # the command writes from now on: it cleans up
        code = COMMANDS[args.command](args)
        if _Interrupts.received:            # a library swallowed its KeyboardInterrupt
            return _interrupted("the command had finished: its outputs are whole")
        return code
    except KeyboardInterrupt as interrupt:
        return _interrupted(getattr(interrupt, "kept", ""))
    except Exception as error:
        if _Interrupts.received:
            return _interrupted()
        if debug:       # the traceback, then the line and exit code as without --debug
            traceback.print_exc()
        hint = "" if debug else TRACEBACK_HINT
        told = str(error) if isinstance(error, ParityInputError) else file_system_refusal(error)
        if told:
            print(f"parity: error: {told}{hint if isinstance(error, UserCodeFailed) else ''}",
                  file=sys.stderr)
            return EXIT_INPUT
        # the user's model code, or a bug of ours: one line either way
        print(f"parity: error: unexpected {in_one_line(error)}{hint}", file=sys.stderr)
        return EXIT_INPUT


def _interrupted(kept: str = "") -> int:
    number = _Interrupts.received or signal.SIGINT      # Python's own KeyboardInterrupt
    try:
        print(f"parity: {INTERRUPT_NAMES[number]}; "
              f"{kept + '; ' if kept else ''}no partial output was left behind", file=sys.stderr)
    except OSError:     # gone with what would read it: a killed parent, a closed terminal
        pass
    return interrupted_exit(number)


def _load_for(args: argparse.Namespace) -> None:
    """Import the libraries the command works with (seconds, for the frameworks), while a
    Ctrl-C ends the process at once: nothing is written yet, and a KeyboardInterrupt raised
    inside an import can come out as another error (numpy's ImportError), or be printed by
    the import machinery as a traceback."""
    if args.command == "convert-weights" or getattr(args, "framework", "") == "mindspore":
        import mindspore  # noqa: F401  (before torch; see DESIGN.md)
    elif args.command == "capture":
        import torch  # noqa: F401
    import parity.api  # noqa: F401
    import parity.report.console  # noqa: F401
    if args.command == "run" or getattr(args, "html", None):     # run writes one by default
        import parity.report.html  # noqa: F401      (matplotlib: 0.6 s)


class _Interrupts:
    """Ctrl-C (SIGINT), SIGTERM (a cancelled CI job, ``timeout``, ``kill``) and SIGHUP (the
    terminal closed: an SSH session dropped). While parity loads, they end the process at once.
    Once a command works, each raises KeyboardInterrupt as Python's own handler does for Ctrl-C
    (the command cleans up on its way out) and is remembered: a library can turn it into
    another error, the interrupt's consequence. The default of SIGTERM and SIGHUP ended the
    process where it stood, leaving a capture's partial directory.
    A user's second Ctrl-C cuts the clean-up short, as asked; in a process parity started
    (``only_the_first``) a second one is the kernel's repeat (processes.end_with_parent).
    """

    SIGNALS = tuple(INTERRUPT_NAMES)
    received: Optional[int] = None
    ends_at_once = True
    only_the_first = False

    @classmethod
    def install(cls) -> None:
        for number in cls.SIGNALS:
            defaults = ((signal.default_int_handler, interrupted_while_loading)
                        if number == signal.SIGINT else (signal.SIG_DFL,))
            if signal.getsignal(number) in defaults:        # not when ignored (nohup)
                signal.signal(number, cls._handle)
        sys.unraisablehook = cls._unraisable

    @classmethod
    def _unraisable(cls, unraisable: Any) -> None:
        """Python prints an exception it cannot raise (in a weakref callback, a __del__) with
        its traceback: our KeyboardInterrupt swallowed there is told by _main instead. Once
        interrupted, any such exception is the interrupt's: an object whose constructor the
        KeyboardInterrupt cut short fails in its __del__ (matplotlib's pyparsing ``Forward``,
        "has no attribute 'expr'", printed beside parity's one line in a fresh-clone CI run)."""
        if not cls.received:
            sys.__unraisablehook__(unraisable)

    @classmethod
    def _handle(cls, signum: int, frame: Any) -> None:
        if cls.received is not None and cls.only_the_first:
            return
        cls.received = signum
        if cls.ends_at_once:
            code = _interrupted()
            sys.stderr.flush()
            os._exit(code)
        raise KeyboardInterrupt
