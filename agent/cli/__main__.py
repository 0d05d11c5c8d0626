"""``python -m kinv.agent.cli``: the command line, as the ``kinv`` script runs it."""

import sys

from kinv.agent.cli.app import main

sys.exit(main())
