"""Running a command: logging, and the line between a user's mistake and a bug.

``prodip`` and each stage's ``python -m prodip.<stage>`` share this. A
:class:`~prodip.base.errors.UserError` (bad config, corpus, checkpoint, export, a gate that said no)
is printed as one line naming the file or key, exit code 2; ``--verbose`` shows its traceback.
Anything else is a bug in prodip or a library: its traceback is shown, with a request to report it.

    python -m prodip.tokenizer --help
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable

from prodip.base.errors import UserError, WriteFailed
from prodip.base.files import room_errno, room_left, room_message

BUG_HINT = (
    "prodip {command}: unexpected error (a bug, not a problem with your input, unless the message "
    "says otherwise); please report it with the traceback above and the command line"
)


#: Library loggers (and their children) whose records below ERROR say nothing about the user's data or
#: settings on a run that works: shown only with ``--verbose`` (DEBUG logging). Why each:
DEMOTED_LOGGERS: dict[str, str] = {
    # torchao (imported by ExecuTorch and probed by transformers) tries its CUDA kernels and triton on a
    # CPU-only install: "Failed to load .../_C_mxfp8...so", "_C_cutlass_90a", "Detected no triton"
    "torchao": "torchao's optional CUDA kernels, absent on this machine",
    # torch deprecates registering Enum subclasses as pytree constants, which torchao does on import
    "torch.utils._pytree": "a deprecation in torchao's own code",
    # gguf-py logs "This GGUF file is for Little Endian only" and the file list of every GGUF it writes
    "gguf.gguf_writer": "gguf-py's progress notes for each file written",
}


def progress_bars(wanted: bool) -> bool:
    """Whether to show a library's progress bars (HF ``tokenizers`` trainers' ``show_progress``): only when
    ``wanted`` and standard output and error are terminals. Off a terminal the trainer draws nothing useful
    but still prints one empty line per bar to standard output (three blank lines in a run's log)."""
    return wanted and sys.stdout.isatty() and sys.stderr.isatty()


def setup_logging(verbose: bool = False) -> None:
    """INFO logging (DEBUG with ``verbose``); under torchrun only rank 0 logs progress, the others warn.
    Library noise (:data:`DEMOTED_LOGGERS`) shows only with ``verbose``."""
    rank = int(os.environ.get("RANK", "0"))
    level = logging.DEBUG if verbose else (logging.INFO if rank == 0 else logging.WARNING)
    prefix = f"[rank {rank}] " if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    logging.basicConfig(
        level=level, format=f"%(asctime)s {prefix}%(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    # the logger's own level, not a handler filter: torch logs through its own handler, not the root's
    for name in DEMOTED_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)


def run_command(func: Callable[[argparse.Namespace], int | None], args: argparse.Namespace, command: str) -> int:
    """Call ``func(args)`` and turn its outcome into an exit code.

    Returns:
        ``func``'s code (0 if it returned None); 2 for a :class:`UserError` or an ``OSError``
        (one line on stderr, naming the file), and for a write refused for lack of room however a
        library wrapped it (safetensors' ``SafetensorError``: :func:`prodip.base.files.room_errno`);
        130 on Ctrl-C; 1 for anything else (a bug: traceback).
    """
    verbose = bool(getattr(args, "verbose", False))
    try:
        return int(func(args) or 0)
    except (UserError, OSError) as err:  # OSError: the file system said no (path, permission, disk), named
        if verbose:
            raise
        print(f"prodip {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"prodip {command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as err:
        if room_errno(err) is None:
            traceback.print_exc()
            print(BUG_HINT.format(command=command), file=sys.stderr)
            return 1
        if verbose:
            raise
        print(f"prodip {command}: error: {_one_line(err)}", file=sys.stderr)
        return 2


#: The exit code of a run stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130


def leave_after_interrupt(code: int) -> int:
    """Return ``code``; after Ctrl-C (:data:`INTERRUPTED`) end the process at once instead.

    For a process that is about to exit anyway (the ``prodip`` command, ``python -m prodip.<stage>``):
    the logs and standard streams are flushed and ``os._exit`` skips the interpreter's teardown, which
    frees every object the run made one by one (its final garbage collection ran for up to a minute on a
    loaded machine after ``prodip ...: interrupted``, printing nothing). What must reach the disk already
    has when the message is printed: the trainer waits for the checkpoint in flight (and says so), and
    metrics.jsonl, TensorBoard and loss.png are closed while the interrupt unwinds.
    """
    if code != INTERRUPTED:
        return code
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to say
            pass
    os._exit(code)


def _one_line(err: BaseException) -> str:
    """The message of a user error; a write refused for lack of room that no artifact writer named
    (:func:`prodip.base.files.writing`) names the file the error carries, else the room in the current folder."""
    code = room_errno(err)
    if code is None or isinstance(err, WriteFailed):
        return str(err)
    filename = getattr(err, "filename", None)
    if filename:
        return room_message(filename, code)
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"a write failed: {os.strerror(code)} ({room_left(os.getcwd(), code)}; from: {first})"


def tool_main(command: str, tool: Callable[[list[str]], int | None], argv: list[str]) -> int:
    """``python -m prodip.<stage>.<tool> ARGS``: run ``tool(argv)`` with :func:`run_command`'s exit
    codes, so a missing or bad input is one line naming it (exit 2), never a traceback.

    Args:
        command: the name shown in errors, e.g. ``tokenizer.portable``.
        tool: the module's ``_main``.
        argv: arguments after the module name.
    """
    return run_command(lambda _args: tool(argv), argparse.Namespace(verbose=False), command)


def stage_main(
    prog: str, register: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], argv: list[str]
) -> int:
    """``python -m prodip.<stage> VERB ...``: parse ``argv`` with the stage's subcommands and run it.

    Args:
        prog: program name for usage lines, e.g. ``python -m prodip.export``.
        register: the stage's ``add_subcommands``.
        argv: arguments after the program name.
    Returns:
        The exit code (see :func:`run_command`); 2 with the usage when no verb is given.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging; tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return run_command(args.func, args, args.command)
