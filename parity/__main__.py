import os
import sys

try:
    from parity.cli import main
except KeyboardInterrupt:       # Ctrl-C while parity loads, before it handles Ctrl-C itself
    print("parity: interrupted; no partial output was left behind", file=sys.stderr)
    os._exit(130)               # parity.errors.EXIT_INTERRUPT, perhaps not imported yet

sys.exit(main())
