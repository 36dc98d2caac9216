import sys

from otelprof.cli import main

sys.exit(main())
