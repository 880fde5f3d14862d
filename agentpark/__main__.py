"""``python -m agentpark``: the same as the ``agentpark`` command."""

import sys

from agentpark.cli import main

sys.exit(main())
