"""`python -m medray.cli`: the same app as the `medray` script."""

from medray.cli import main

main()
