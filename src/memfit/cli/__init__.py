"""The ``memfit`` command line: a package of thin doors, one module per command family.

:mod:`memfit.cli.entry` builds the parser and runs one command line (:func:`main`); each command
module registers its subcommands and turns flags into a job, calls the library and renders the
answer. The argparse types, the exit codes and the flag table live one layer lower, in
:mod:`memfit.flags`, which :mod:`memfit.web` shares without importing this package.
"""

from memfit.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
