import os
import sys

try:
    from parity.cli import main
except KeyboardInterrupt:       # Ctrl-C while parity loads, before it handles Ctrl-C itself
    print("parity: interrupted", file=sys.stderr)
    os._exit(130)

sys.exit(main())
