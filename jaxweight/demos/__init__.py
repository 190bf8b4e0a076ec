"""End-to-end demos run by ``python -m jaxweight demo NAME``.

Each demo module exposes ``main(argv: list[str]) -> int`` with its own argparse
(``--out DIR`` for plots and tables, ``--quick`` for the small version the test
suite runs).
"""

from ._common import provenance

__all__ = ["provenance"]
