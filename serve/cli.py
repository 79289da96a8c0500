"""``prodip serve EXPORT_DIR`` (and ``python -m prodip.serve serve EXPORT_DIR``): run the HTTP server.

prodip serve runs/demo/export --variant int8 --port 8000   # the export `make demo` writes
"""

from __future__ import annotations

import argparse

from prodip.base.config import add_arguments, resolve
from prodip.serve.app import run_server
from prodip.serve.config import ServeConfig


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None) -> None:
    """Register ``serve`` on the ``prodip`` parser (see prodip/cli.py)."""
    if only not in (None, "serve"):
        return
    p = subparsers.add_parser(
        "serve",
        help="HTTP generation (OpenAI-compatible) from an export dir on ONNX Runtime",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("export_dir", metavar="EXPORT_DIR", help="dir written by `prodip export`")
    p.add_argument(
        "--config",
        metavar="TOML",
        help="TOML file; its [serve] table sets ServeConfig fields (`prodip serve` checks every table, as `prodip run`)",
    )
    p.add_argument(
        "--allow-unverified",
        dest="allow_unverified",
        action="store_const",
        const=True,
        default=argparse.SUPPRESS,
        help="serve a variant whose conformance verdict is missing or failing",
    )
    add_arguments(p, ServeConfig, skip=("export_dir", "allow_unverified"), section="serve")
    p.set_defaults(func=_run)


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """ServeConfig from defaults < the TOML [serve] table < flags (EXPORT_DIR is positional)."""
    return resolve(ServeConfig, args, toml_path=getattr(args, "config", None), section="serve")


def _run(args: argparse.Namespace) -> int:

    return run_server(config_from_args(args))
