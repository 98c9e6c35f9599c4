"""`python -m topas_agents.server [ARGS]` is `topas serve [ARGS]`."""

import sys

from topas_agents.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
