"""``python -m fedbench.report`` = ``fedbench-report``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
