"""taciturn's command line: parse, validate, call the runner. Nothing else lives here."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(stderr=True)
EXIT_USAGE = 2


def _demo_config(name: str) -> Path:
    return Path(str(resources.files("taciturn.experiments") / "configs" / name))


def cmd_run(args: argparse.Namespace) -> int:
    from taciturn.experiments import types

    config = types.load(args.config, args.set or [])
    out = Path(args.out or Path("runs") / config.name)
    rundir = types.start(
        config, out, report=not args.no_report, overwrite=args.overwrite, progress=not args.quiet
    )
    _print_summary(rundir)
    return 0


# benchmarks/frontier.py --write-demo: its best uncompressed baseline, then taciturn's best
# configuration, at setting B's highest target, on that setting's workload for the same rounds
DEMO_CONFIGS = ("demo_baseline.toml", "demo_winner.toml")
DEMO_NOTE = (
    "The best uncompressed baseline and taciturn's best configuration (any method, compressor and "
    "trigger it offers) at the highest target accuracy of benchmarks/frontier.py's setting B, each "
    "chosen on the tuning seed, ran the same rounds on the same workload (100 clients, Dirichlet 0.5 "
    "over Fashion-MNIST, MLP 784-200-10). Bytes are uplink plus downlink as the ledger counts them: "
    "where the winner's curve lies left of the baseline's, it reached that accuracy with fewer bytes. "
    "One seed, a picture and not evidence; the claim, with 95% intervals over 5 report seeds, is the "
    "frontier section of docs/benchmarks.md."
)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the frontier's winner beside the best baseline (DEMO_CONFIGS) and compare them in one report."""
    from taciturn.experiments import types
    from taciturn.report.html import write_comparison
    from taciturn.report.rundir import check_comparison_folder

    out = Path(args.out or "runs/demo")
    check_comparison_folder(out)  # before any work: the demo writes its comparison there
    rundirs = []
    for name in DEMO_CONFIGS:
        config = types.load(_demo_config(name), args.set or [])
        console.print(f"[bold]{config.name}[/]: {config.algorithm.name}, {config.rounds} rounds")
        rundirs.append(types.start(config, out / config.name, overwrite=True, progress=not args.quiet))
        _print_summary(rundirs[-1])
    report = write_comparison(rundirs, out, DEMO_NOTE)
    console.print(f"[bold green]demo report[/]: [bold]{report}[/]")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from taciturn.experiments import types

    _print_summary(types.resume(Path(args.run), progress=not args.quiet, trust_code=args.trust_code))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from taciturn.experiments.export import export

    path = export(
        _existing_run(args.run).path,
        Path(args.out),
        args.format,
        args.round,
        overwrite=args.overwrite,
        best=args.best,
        trust_code=args.trust_code,
    )
    console.print(f"exported: [bold]{path}[/]")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from taciturn.experiments import types

    for path in args.runs:
        console.print(f"report: [bold]{types.report(_existing_run(path))}[/]")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from taciturn.experiments import types

    out, rows = types.compare([_existing_run(p) for p in args.runs], Path(args.out))
    keys = list(next(iter(rows.values())))
    table = Table(title="comparison")
    table.add_column("run")
    for k in keys:
        table.add_column(k, justify="right")
    for run, row in rows.items():
        table.add_row(run, *(str(row.get(k, "-")) for k in keys))
    Console().print(table)
    console.print(f"comparison: [bold]{out}[/]")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from taciturn.data import fashion_mnist
    from taciturn.data.datasets import DatasetNotFound

    if args.action == "fetch":  # use a verified copy if there is one, else download into the cache
        try:
            _, source = fashion_mnist.locate(Path(args.path) if args.path else None, allow_download=False)
        except DatasetNotFound:
            source = f"downloaded into {fashion_mnist.download(Path(args.path) if args.path else None)}"
        console.print(f"Fashion-MNIST ready ({source})")
        return 0
    table = Table(title="datasets")
    for column in ("dataset", "status", "source"):
        table.add_column(column)
    try:
        _, source = fashion_mnist.locate(Path(args.path) if args.path else None, allow_download=False)
        table.add_row("fashion_mnist", "[green]available[/]", source)
    except DatasetNotFound as error:
        table.add_row("fashion_mnist", "[red]missing[/]", escape(str(error)))
    table.add_row("digits", "[green]available[/]", "bundled with scikit-learn")
    table.add_row("synthetic", "[green]available[/]", "generated from the run seed")
    Console().print(table)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """Helpers for a real federation on Flower's deployment runtime (docs/deploy.md)."""
    if args.action == "certs":
        from taciturn.deploy.certs import make_credentials

        written = make_credentials(
            Path(args.dir), tuple(args.host or ()), args.nodes, args.overwrite, args.days, args.renew
        )
        for name, path in written.items():
            console.print(f"{name:12} {path}")
        if not written:
            console.print(f"{args.dir} already holds all of it: nothing written")
        return 0
    if args.action == "node":
        from taciturn.deploy.node import run_node

        return run_node(args)
    from taciturn.deploy.app_folder import write_app
    from taciturn.experiments import types

    config = types.load(args.config, args.set or [])
    pyproject = write_app(
        Path(args.app),
        config,
        Path(args.out),
        args.round_timeout,
        args.overwrite_run,
        args.min_nodes,
        args.overwrite,
        args.min_trained,
        args.patience,
    )
    console.print(f"Flower app for run {config.name!r}: [bold]{pyproject.parent}[/]")
    console.print(f"start it with: flwr run {pyproject.parent} <superlink connection>")
    return 0


def _existing_run(path: str):
    from taciturn.report.rundir import RunDir

    return RunDir(path).require()


def _print_summary(rundir) -> None:
    from taciturn.experiments import types

    if line := types.headline(rundir):
        console.print(f"[bold green]done[/]: {line}")
    if rundir.has(rundir.report):
        console.print(f"report: [bold]{rundir.report}[/]")


USAGE = """Federated learning that counts every byte: run a federation from a TOML config, resume it,
report on it, compare runs, export the trained model.

  taciturn demo                         FedAvg and event-based ADMM on Fashion-MNIST, in one report
  taciturn run CONFIG.toml              a run into runs/<name>: metrics, ledger, checkpoints, report.html
  taciturn resume RUN_DIR               continue from the last checkpoint
  taciturn export RUN_DIR --out m.safetensors   the trained model, for model.load_state_dict (--best)
  taciturn deploy app CONFIG.toml --app DIR --out RUN_DIR   the same run between machines (docs/deploy.md)

Your own model and data: model.factory = "package.module:function" in the config, or
taciturn.run(config, model=..., data=...) from Python (docs/guide.md)."""


TRUST_HELP = (
    "import the code the run's config names (model.factory, data.factory, a loss) even though the "
    "folder was not written by your taciturn on this machine (received, or edited): read that code first"
)


def build_parser() -> argparse.ArgumentParser:
    from taciturn import __version__

    parser = argparse.ArgumentParser(
        prog="taciturn", description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"taciturn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run an experiment from a TOML config")
    run.add_argument("config", type=Path)
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    run.add_argument("--out", help="run directory (default: runs/<name>)")
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing run: delete the files its manifest.json lists (nothing else)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--no-report",
        action="store_true",
        help="skip report.html and plots (`taciturn report` writes them later)",
    )
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="FedAvg and event-based ADMM on Fashion-MNIST, compared in one report")
    demo.add_argument("--set", action="append", metavar="KEY=VALUE")
    demo.add_argument("--out")
    demo.add_argument("--quiet", action="store_true")
    demo.set_defaults(func=cmd_demo)

    resume = sub.add_parser("resume", help="continue a run from its last checkpoint")
    resume.add_argument("run")
    resume.add_argument("--quiet", action="store_true")
    resume.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    resume.set_defaults(func=cmd_resume)

    export = sub.add_parser(
        "export", help="write a run's trained model: a safetensors state_dict or a Hugging Face folder"
    )
    export.add_argument("run")
    export.add_argument("--out", required=True, help="the file (state_dict) or folder (hf) to write")
    export.add_argument(
        "--format",
        choices=["state_dict", "hf"],
        default="state_dict",
        help="state_dict: safetensors for model.load_state_dict; hf: save_pretrained (Hugging Face models)",
    )
    export.add_argument("--round", type=int, help="a kept checkpoint's round (default: the last)")
    export.add_argument(
        "--best", action="store_true", help="the best model ([checkpoint] best) instead of the last"
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    export.add_argument("--trust-code", action="store_true", help=TRUST_HELP)
    export.set_defaults(func=cmd_export)

    report = sub.add_parser("report", help="rebuild plots and report.html of run directories")
    report.add_argument("runs", nargs="+")
    report.set_defaults(func=cmd_report)

    compare = sub.add_parser("compare", help="compare run directories side by side")
    compare.add_argument("runs", nargs="+")
    compare.add_argument(
        "--out", default="runs/compare", help="folder for the comparison report.html and plots"
    )
    compare.set_defaults(func=cmd_compare)

    data = sub.add_parser("data", help="show where datasets come from, or fetch them")
    data.add_argument(
        "action",
        nargs="?",
        choices=["show", "fetch"],
        default="show",
        help="show: where each dataset comes from; fetch: make Fashion-MNIST available",
    )
    data.add_argument("--path", help="a folder to read from (show) or download into (fetch)")
    data.set_defaults(func=cmd_data)

    deploy = sub.add_parser("deploy", help="run on Flower's deployment runtime: test certificates, the app")
    actions = deploy.add_subparsers(dest="action", required=True, metavar="ACTION")
    certs = actions.add_parser("certs", help="a test CA, the SuperLink's TLS certificate, SuperNode keys")
    certs.add_argument("dir", help="folder to write them into")
    certs.add_argument(
        "--host",
        action="append",
        default=None,
        help="a name or address nodes reach the SuperLink at (repeatable; 127.0.0.1 and localhost always)",
    )
    certs.add_argument("--nodes", type=int, default=2, help="how many SuperNode key pairs in all")
    certs.add_argument("--days", type=int, default=365, help="validity of a new server certificate")
    certs.add_argument("--renew", action="store_true", help="a new server certificate in any case")
    certs.add_argument(
        "--overwrite", action="store_true", help="make everything afresh, the CA too (every node re-keyed)"
    )
    node = actions.add_parser(
        "node", help="a SuperNode serving its clients from one long-lived process, restarted if it exits"
    )
    from taciturn.deploy.node import add_arguments

    add_arguments(node)
    app = actions.add_parser("app", help="the Flower app folder for `flwr run`, with this run's config")
    app.add_argument("config", type=Path)
    app.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    app.add_argument("--app", required=True, help="the app folder to write")
    app.add_argument("--out", required=True, help="the run directory the server side writes")
    app.add_argument(
        "--round-timeout", type=float, default=120.0, help="seconds to wait for a round's replies"
    )
    app.add_argument(
        "--min-nodes", type=int, default=1, help="SuperNodes to wait for at the start of each round"
    )
    app.add_argument(
        "--min-trained",
        type=int,
        default=1,
        help="the floor: a round in which fewer picked clients trained falls short",
    )
    app.add_argument(
        "--patience",
        type=int,
        default=3,
        help="short rounds in a row after which the run stops with an error",
    )
    app.add_argument(
        "--overwrite-run", action="store_true", help="let the run replace an earlier one in --out"
    )
    app.add_argument("--overwrite", action="store_true", help="replace an app folder written earlier")
    deploy.set_defaults(func=cmd_deploy)
    return parser


def main(argv: list[str] | None = None) -> int:
    from taciturn.core.errors import TaciturnError

    args = build_parser().parse_args(argv)
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_time=False, show_path=False, level=logging.WARNING)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[handler])
    try:
        return args.func(args)
    except TaciturnError as error:  # bad input, explained by the layer that found it
        _print_error(str(error))
        return EXIT_USAGE
    except OSError as error:  # a file the user named cannot be read or written
        where = f": {error.filename}" if error.filename else ""
        _print_error(f"{error.strerror or error}{where}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: continue with `taciturn resume <run dir>`")
        return 130


def _print_error(message: str) -> None:
    console.print(f"[bold red]error[/]: {escape(message)}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
