"""`python -m medray.cli ...` is the `medray` command."""

from medray.cli import main

main()
