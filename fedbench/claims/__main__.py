"""``python -m fedbench.claims`` = ``fedbench-claims``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
