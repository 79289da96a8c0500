"""``prodip conformance EXPORT_DIR --checkpoint CKPT --shards-dir SHARDS``: check every artifact of an export.

Exit code 0 when every check passes, 1 when any fails (report written, verdict recorded in the
manifest), 2 on bad input (no export, wrong checkpoint, bad or incomplete tolerance file, a missing
file of a checked variant, no --shards-dir for the required held-out check bpc_delta_max; nothing
measured or written). A tolerance file with bounds looser than the shipped
conformance/tolerances.toml is allowed, but each such bound is listed under LOOSENED TOLERANCES in
report.md, recorded in report.json and the manifest verdict, warned about here and by `prodip serve`.

    prodip conformance runs/demo/export --checkpoint runs/demo/train --shards-dir runs/demo/shards
    python -m prodip.conformance runs/demo/export --shards-dir runs/demo/shards --variants fp32,int8 --out /tmp/conformance
"""

from __future__ import annotations

import argparse
import sys

from prodip.base.config import add_arguments, resolve
from prodip.conformance.config import ConformanceConfig
from prodip.conformance.suite import run_conformance
from prodip.conformance.tolerances import loosened_text


def _run(args: argparse.Namespace) -> int:

    if getattr(args, "export_dir_positional", None):
        args.export_dir = args.export_dir_positional
    cfg = resolve(ConformanceConfig, args, toml_path=args.config, section="conformance")
    report = run_conformance(cfg)
    md = report["report_json"].replace("report.json", "report.md")
    print(open(md, encoding="utf-8").read())
    loosened = report["tolerances"]["loosened"]
    if loosened:
        print(
            f"prodip conformance: WARNING: {len(loosened)} tolerance bound(s) looser than the shipped "
            f"conformance/tolerances.toml ({report['tolerances']['path']}): {loosened_text(loosened)}",
            file=sys.stderr,
        )
    return 0 if report["passed"] else 1


def add_subcommands(subparsers: argparse._SubParsersAction, only: str | None = None) -> None:
    """Register ``conformance`` on the ``prodip`` parser (``only`` = the one subcommand wanted)."""

    if only not in (None, "conformance"):
        return
    p = subparsers.add_parser(
        "conformance",
        help="prove every exported artifact computes what the training model computes",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("export_dir_positional", nargs="?", metavar="EXPORT_DIR", help="export dir (same as --export-dir)")
    p.add_argument("--config", metavar="TOML", default=None, help="TOML file with a [conformance] table")
    add_arguments(p, ConformanceConfig, section="conformance")
    p.set_defaults(func=_run)
