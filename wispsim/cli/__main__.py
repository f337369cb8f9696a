"""``python -m wispsim.cli``: the same as the ``wispsim`` console script."""

from wispsim.cli.main import main

main()
