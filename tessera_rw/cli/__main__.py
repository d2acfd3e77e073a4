import sys

from tessera_rw.cli import main

sys.exit(main())
