"""`python -m homelab_frontend`: the same command line as the `homelab-frontend` script."""

import sys

from .cli import main

sys.exit(main())
