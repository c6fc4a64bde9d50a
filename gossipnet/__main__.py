"""``python -m gossipnet``: the same as the ``gossipnet`` command."""

import sys

from gossipnet.cli import main

sys.exit(main())
