"""What the ``specdec`` commands share (:mod:`specdec.cli` and :mod:`specdec.cli_train`): the error type, the parser
class, the checks of flags every command has, and the output folder and progress-bar helpers. Imports only the
standard library at the top, so building the parser stays cheap."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CliError", "Parser", "add_debug", "check_device", "check_min", "loading_bars", "option_value",
           "prepare_out"]


class CliError(ValueError):
    """A command-line mistake, already phrased for the user (value, rule, fix)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the same one line as every other error. ``populate``, when given,
    adds the arguments on first use (parsing or help), so a subcommand's imports wait until it runs."""

    def __init__(self, *args: Any, populate: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._populate = populate

    def _ensure_populated(self) -> None:
        populate, self._populate = self._populate, None
        if populate is not None:
            populate(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._ensure_populated()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._ensure_populated()
        return super().format_help()

    def format_usage(self) -> str:
        self._ensure_populated()
        return super().format_usage()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_debug(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--debug", action="store_true", default=default,
                        help="on an error, show the Python traceback instead of one line")


def check_min(flag: str, value: Any, minimum: int, hint: str = "") -> None:
    if value is not None and value < minimum:
        raise CliError(f"{flag} {value} is invalid: it must be an int >= {minimum}{hint}.")


def check_device(device: str | None) -> None:
    """Refuse a ``--device`` that is not cpu, cuda or cuda:N of a GPU this machine has."""
    if device is None:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        cuda = f"CUDA is available here ({count} device(s): cuda:0..cuda:{count - 1})"
    elif torch.version.cuda is None:
        cuda = f"CUDA is not available here (torch {torch.__version__} is built without it)"
    else:
        cuda = "CUDA is not available here (no GPU found)"
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device.strip())
    if match is None:
        raise CliError(f"--device {device!r} is invalid: use cpu, cuda or cuda:N (N a GPU index); {cuda}.")
    if device.startswith("cuda") and (not count or int(match.group(1) or 0) >= count):
        raise CliError(f"--device {device} is invalid: {cuda}; use --device cpu"
                       + (" or one of the devices listed." if count else "."))


@contextlib.contextmanager
def loading_bars(show: bool) -> Iterator[None]:
    """transformers' (and huggingface_hub's) progress bars off while loading when ``show`` is False."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not show and was_on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not show and was_on:
            hf_logging.enable_progress_bar()


def prepare_out(out: str) -> None:
    """Create --out now and check it takes files, so a bad folder fails before minutes of benchmarking."""
    import tempfile

    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise CliError(f"--out {out!r} cannot be written ({exc.strerror or exc}): pass a folder you can write "
                       "to, e.g. --out /tmp/specdec-bench.") from None


def option_value(raw: str) -> Any:
    """The value of a ``key=value`` flag (``--option``, ``--method-option``): JSON where it parses (numbers,
    booleans, lists, null), else the text as given."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw
