"""`python -m quotas.simulate` (SCENARIO.md): the simulator's command line. The simulator itself is
quotas.engine.simulate, part of the pure engine."""

import sys

from quotas.engine.simulate import main

if __name__ == "__main__":
    sys.exit(main())
