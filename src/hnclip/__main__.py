import os
import sys

# Idle OpenMP threads sleep instead of spinning: on a small shared CPU, spinning threads of one
# job starve the others (a 2-thread job slowed 20x next to other jobs). Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hnclip.cli import main  # noqa: E402

sys.exit(main())
