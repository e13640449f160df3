"""`python -m medray ...` is the `medray` command."""

from medray.cli import main

main()
