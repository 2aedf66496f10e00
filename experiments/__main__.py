"""``python -m experiments run|report|keys``: the study's command line (:mod:`experiments.cli`)."""

import sys

from experiments.cli import main

sys.exit(main())
