"""``python -m unimq``: the same as the ``unimq`` console script."""

import sys

from unimq.cli import main

sys.exit(main())
