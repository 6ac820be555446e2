"""`python -m quotas.tracegen`: the trace generator's command line (quotas.engine.tracegen)."""

import sys

from quotas.engine.tracegen import main

if __name__ == "__main__":
    sys.exit(main())
