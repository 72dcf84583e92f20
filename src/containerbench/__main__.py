import sys

from containerbench.cli import main

sys.exit(main())
