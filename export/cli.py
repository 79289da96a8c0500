"""``prodip export`` subcommand registration.

prodip export runs/demo/train --out runs/demo/export
python -m prodip.export export runs/demo/train --out /tmp/export --variants fp32,int4 --force
"""

from __future__ import annotations

import argparse

from prodip.base.config import add_arguments, resolve
from prodip.base.errors import InvalidInput
from prodip.base.variants import ONNX_VARIANTS
from prodip.export.config import VARIANTS, ExportConfig
from prodip.export.core import export_checkpoint


def _export_main(args: argparse.Namespace) -> int:

    if getattr(args, "checkpoint_pos", None):
        given = getattr(args, "checkpoint", None)
        if given is not None and given != args.checkpoint_pos:
            raise InvalidInput(
                f"two checkpoints given: {args.checkpoint_pos} (positional) and --checkpoint {given}; give one"
            )
        args.checkpoint = args.checkpoint_pos
    if getattr(args, "force_flag", False):
        args.force = True
    cfg = resolve(ExportConfig, args, toml_path=args.config, section="export")
    out = export_checkpoint(cfg)
    print(f"export dir: {out}")
    return 0


def add_subcommands(subparsers, only: str | None = None) -> None:
    """Register ``export`` on the ``prodip`` subparsers (``only`` other than export/None: nothing)."""
    if only not in (None, "export"):
        return

    parser = subparsers.add_parser(
        "export",
        help=f"checkpoint -> HF safetensors + ONNX ({'/'.join(ONNX_VARIANTS)}) + manifest",
        description="Export a training checkpoint into an HF-loadable folder with ONNX decoders "
        f"(KV cache) and quantised variants ({', '.join(VARIANTS)}), each file hashed in "
        "manifest.json. Settings come from the [export] table of --config; flags override.",
    )
    parser.add_argument(
        "checkpoint_pos",
        nargs="?",
        metavar="CHECKPOINT",
        help="step dir, checkpoints dir or run dir (same as --checkpoint)",
    )
    parser.add_argument("--config", metavar="TOML", help="file with an [export] table")
    add_arguments(parser, ExportConfig, skip=("force",), section="export")
    parser.add_argument(
        "--force", dest="force_flag", action="store_true", help="replace an existing, non-empty export dir"
    )
    parser.set_defaults(func=_export_main)
