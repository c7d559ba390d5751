"""``python -m hpo.cli ARGS``: the ``hpo`` command where the console script is not on
PATH (a Ray job's entrypoint, tests that run the CLI in a subprocess)."""

from hpo.cli import main

main()
