"""Argument-parsing helpers shared by every hwnas command line (``hwnas`` and its subcommands,
the benchmark harnesses): one-line usage errors with exit status 2, and numeric argument types
that reject negative, NaN and infinite values (and zero where it must be positive)."""

from __future__ import annotations

import argparse
import math

EXIT_USER_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), like every other error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


#: seeds are 32-bit unsigned (numpy's and Optuna's samplers reject others)
MAX_SEED = 2 ** 32 - 1


def seed_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED}, got {value}")
    return value


def bounded_int(maximum: int):
    """A positive-integer argument type with an upper bound (e.g. epochs, so a typo such as
    ``1e30`` written out fails at once instead of running for ever)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected a positive integer up to {maximum}, "
                                             f"got {value}")
        return value

    return parse
