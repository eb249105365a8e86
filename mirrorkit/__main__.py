"""`python -m mirrorkit` is the same as the `mirrorkit` command."""

from mirrorkit.cli import main

main()
