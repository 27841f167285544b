"""``python -m llmplane.sim --model NAME --port 0``."""

import sys

from llmplane.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
