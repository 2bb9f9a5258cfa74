"""``python -m sinkscope.cli``: the ``sinkscope`` command."""

import sys

from sinkscope.cli import main

sys.exit(main())
